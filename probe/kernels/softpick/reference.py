"""Readable fp32 (fp64 for fp64 inputs) reference of softpick attention (docs/definitions.md#softpick).

    s_ij  = scale * q_i . k_j + key_bias_j            for visible j (the causal / window rule), -inf otherwise
    m_i   = max(0, max_j s_ij)                       a shift for stability only (see below)
    e_ij  = exp(s_ij - m_i) - exp(-m_i)              = exp(-m_i) (exp(s_ij) - 1)
    a_ij  = relu(e_ij) / (sum_{j visible} |e_ij| + eps)        eps = 1e-8
    out_i = sum_j a_ij v_j                           rows sum to 1 - phantom_i <= 1 (phantom_i: the unspent mass)

The authors' code (zaydzuhri/softpick-attention, ``naive_softpick_attn.py``, ``softpick``) shifts by the row max m_i
itself; for a row whose max is below 0 every e_ij is negative, so every weight is exactly 0 under either shift, and
max(0, m_i) keeps exp(-m_i) from overflowing (fp32 exp overflows past 88) where the authors' shift gives NaN. Keys the
row cannot see add nothing to either sum (the authors' ``torch.where(x.isfinite(), |e|, 0)``); a row that sees no key
gets zero weights, not NaN.
"""

from __future__ import annotations

import torch

SOFTPICK_EPS = 1e-8  # the authors' default eps


def softpick_of_scores(scores: torch.Tensor, eps: float = SOFTPICK_EPS) -> torch.Tensor:
    """The softpick weights (B,H,Tq,Tk) of scores (B,H,Tq,Tk), hidden keys -inf, in the scores' dtype (differentiable;
    the same function of the scores as the authors' ``softpick(x, dim=-1, eps)``)."""
    visible = torch.isfinite(scores)
    m = scores.amax(-1, keepdim=True).clamp_min(0.0)  # max(0, row max); -inf rows: 0
    e = torch.exp(scores - m) - torch.exp(-m)  # hidden keys: -exp(-m), excluded below
    den = torch.where(visible, e.abs(), torch.zeros_like(e)).sum(-1, keepdim=True) + eps
    return torch.relu(e) / den
