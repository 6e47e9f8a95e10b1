"""Readable fp32 (fp64 for fp64 inputs) reference of stick-breaking attention
(docs/definitions.md#stick-breaking-attention).

    s_ij     = scale * q_i . k_j + key_bias_j       for visible j (the causal / window rule, j = i included), -inf else
    beta_ij  = sigmoid(s_ij)                        the share of the stick left at key j that key j takes
    A_ij     = beta_ij * prod_{j < k <= i, k visible} (1 - beta_ik)        the nearer keys break the stick first
    log A_ij = log sigmoid(s_ij) + sum_{k > j} log sigmoid(-s_ik)          (hidden keys add 0 to the sum)
    out_i    = sum_j A_ij v_j                       rows sum to 1 - prod_k (1 - beta_ik) <= 1; the rest is the phantom

In log space, as the authors' ``sb_ref.stickbreaking`` (shawntan/stickbreaking-attention): log sigmoid is softplus's
negative, so no product underflows before the exp. The sum over later keys is a reversed cumulative sum over the keys
(the authors multiply by a (T, T) triangular matrix instead: the same sum, O(T^3)).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def later_sum(x: torch.Tensor) -> torch.Tensor:
    """y_j = sum_{k > j} x_k along the last axis (a reversed, exclusive cumulative sum; no subtraction)."""
    inclusive = x.flip(-1).cumsum(-1).flip(-1)  # sum_{k >= j}
    return F.pad(inclusive[..., 1:], (0, 1))


def stickbreaking_of_scores(scores: torch.Tensor) -> torch.Tensor:
    """The stick-breaking weights (B,H,Tq,Tk) of scores (B,H,Tq,Tk), hidden keys -inf, in the scores' dtype
    (differentiable; the authors' ``stickbreaking`` weights with the diagonal visible, their attend_current=True)."""
    visible = torch.isfinite(scores)
    z = torch.where(visible, scores, torch.zeros_like(scores))  # finite everywhere: no inf reaches autograd
    log_beta = torch.where(visible, F.logsigmoid(z), torch.full_like(z, float("-inf")))  # -inf: hidden keys take 0
    log_keep = torch.where(visible, F.logsigmoid(-z), torch.zeros_like(z))  # 0: hidden keys break nothing
    return torch.exp(log_beta + later_sum(log_keep))
