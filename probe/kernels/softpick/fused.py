"""softpick's rule (reference.py's ``softpick_of_scores``) as one autograd function with its backward written out,
so a forward + backward makes fewer (B, H, Tq, Tk) passes than autograd through the reference does.

    forward    m = max(0, max_j s_j), e_j = exp(s_j - m) - exp(-m) (0 where hidden), D = sum_j |e_j| + eps,
               a_j = relu(e_j) / D
    backward   with g the gradient on a and c = sum_j g_j a_j:
               dL/de_j = (g_j [e_j > 0] - c sign(e_j)) / D,  dL/ds_j = dL/de_j exp(s_j - m)  (visible j)
               and through m (where m > 0; its gradient goes to the key the max picks): dL/dm = -sum_j dL/de_j e_j
               = -c eps / D
"""

from __future__ import annotations

import torch

from probe.kernels.softpick.reference import SOFTPICK_EPS


class _Softpick(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores: torch.Tensor, eps: float) -> torch.Tensor:
        hidden = torch.isfinite(scores).logical_not_()  # B,H,Tq,Tk; kept for the backward
        top, arg = scores.max(-1, keepdim=True)
        m = top.clamp_min(0.0)
        shift = torch.exp(-m)
        e = torch.exp(scores - m).sub_(shift).masked_fill_(hidden, 0.0)
        den = e.abs().sum(-1, keepdim=True).add_(eps)
        a = e.clamp_min(0.0).div_(den)
        ctx.eps = eps
        ctx.save_for_backward(e, a, den, shift, hidden, arg, top > 0)
        return a

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        e, a, den, shift, hidden, arg, shifted = ctx.saved_tensors
        c = (grad * a).sum(-1, keepdim=True)
        ge = torch.where(e > 0, grad, 0.0).sub_(c * torch.sign(e)).div_(den)
        gs = ge.mul_(e + shift).masked_fill_(hidden, 0.0)  # exp(s - m) = e + exp(-m) on visible keys
        gm = torch.where(shifted, -c * ctx.eps / den, 0.0)  # the gradient through the shift m = max_j s_j
        gs.scatter_add_(-1, arg, gm)
        return gs, None


def softpick_of_scores_fused(scores: torch.Tensor, eps: float = SOFTPICK_EPS) -> torch.Tensor:
    """reference.softpick_of_scores, the same values, with the backward above."""
    return _Softpick.apply(scores, eps)
