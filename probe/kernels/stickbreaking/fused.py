"""The stick-breaking rule (reference.py's ``stickbreaking_of_scores``) as one autograd function with the backward
written out: it keeps the scores and the weights (the weights are the tensor the value product keeps anyway), where
autograd through the reference keeps every log-space intermediate.

    forward    A_ij = exp(log beta_ij + sum_{k > j} log(1 - beta_ik))
    backward   with g the gradient on A and u_ij = g_ij A_ij (the gradient on log A_ij):
               d log A_ij / d s_ij = 1 - beta_ij           (log sigmoid' = sigmoid(-s))
               d log A_ij / d s_ik = -beta_ik for k > j     (log sigmoid(-s)' = -sigmoid(s))
               so dL/ds_ik = u_ik (1 - beta_ik) - beta_ik sum_{j < k} u_ij, and 0 on hidden keys
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from probe.kernels.stickbreaking.reference import later_sum, log_shares


def _earlier_sum(x: torch.Tensor) -> torch.Tensor:
    """y_k = sum_{j < k} x_j along the last axis (an exclusive cumulative sum; no subtraction)."""
    return F.pad(x.cumsum(-1)[..., :-1], (1, 0))


class _StickBreaking(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores: torch.Tensor) -> torch.Tensor:
        _, log_beta, log_keep = log_shares(scores)
        weights = torch.exp(log_beta + later_sum(log_keep))  # B,H,Tq,Tk
        ctx.save_for_backward(scores, weights)
        return weights

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        scores, weights = ctx.saved_tensors
        visible = torch.isfinite(scores)
        beta = torch.sigmoid(torch.where(visible, scores, torch.zeros_like(scores)))
        u = grad * weights  # B,H,Tq,Tk; 0 on hidden keys
        gs = u * (1.0 - beta) - beta * _earlier_sum(u)
        return torch.where(visible, gs, torch.zeros_like(gs))


def stickbreaking_of_scores_fused(scores: torch.Tensor) -> torch.Tensor:
    """reference.stickbreaking_of_scores, the same values, with the backward above."""
    return _StickBreaking.apply(scores)
