"""Differential attention's own parts (DIFF V1, Ye et al. 2024; docs/definitions.md#differential-attention): the four
λ vectors and λ_init of a layer, and the per-head sub-layer norm with its (1 - λ_init) scale, as the authors'
``multihead_diffattn.py``. The attention module (probe.models.attention) owns the projections and fires the hooks;
the op is probe.kernels.diff_attention.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from probe.kernels.common import wide
from probe.kernels.diff_attention import lambda_init
from probe.models.layers import RMSNorm

SUBLN_EPS = 1e-5  # the authors' RMSNorm(2 * head_dim, eps=1e-5) after the difference


class Differential(nn.Module):
    """λ = exp(λ_q1·λ_k1) - exp(λ_q2·λ_k2) + λ_init, one value for all the layer's heads, and the sub-layer norm
    (an RMSNorm over each head's dv with a gain) times (1 - λ_init) on each head's output."""

    param_roles = {
        "lambda_q1": "diff_lambda",
        "lambda_k1": "diff_lambda",
        "lambda_q2": "diff_lambda",
        "lambda_k2": "diff_lambda",
        "subln": "norm",
    }

    def __init__(self, d_head: int, d_value: int, layer: int):
        super().__init__()
        self.lambda_init = lambda_init(layer)  # layer is 0-based, as the authors' depth
        # drawn N(0, 0.1²) by the model's init (role diff_lambda); zeros until then
        self.lambda_q1 = nn.Parameter(torch.zeros(d_head))
        self.lambda_k1 = nn.Parameter(torch.zeros(d_head))
        self.lambda_q2 = nn.Parameter(torch.zeros(d_head))
        self.lambda_k2 = nn.Parameter(torch.zeros(d_head))
        self.subln = RMSNorm(d_value, SUBLN_EPS)

    def lam(self, n_heads: int) -> torch.Tensor:
        """λ (H,) fp32 (fp64 for fp64 weights), the layer's one value repeated per head."""
        one = torch.exp((wide(self.lambda_q1) * wide(self.lambda_k1)).sum(-1))
        two = torch.exp((wide(self.lambda_q2) * wide(self.lambda_k2)).sum(-1))
        return (one - two + self.lambda_init).expand(n_heads)

    def finish(self, out: torch.Tensor) -> torch.Tensor:
        """(1 - λ_init) · subln(out): out (B,T,H,dv), each head normalised over its dv."""
        return self.subln(out) * (1 - self.lambda_init)
