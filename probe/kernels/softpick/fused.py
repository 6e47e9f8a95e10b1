"""softpick's rule (reference.py's ``softpick_of_scores``) as one autograd function with its backward written out,
so a forward + backward makes fewer (B, H, Tq, Tk) passes than autograd through the reference does.

    forward    m = max(0, max_j s_j), e_j = exp(s_j - m) - exp(-m) (0 where hidden), D = sum_j |e_j| + eps,
               a_j = relu(e_j) / D
    backward   with g the gradient on a and c = sum_j g_j a_j:
               dL/de_j = (g_j [e_j > 0] - c sign(e_j)) / D,  dL/ds_j = dL/de_j exp(s_j - m)  (visible j)
               and through m (where m > 0; its gradient is shared by the keys at the max, as for the reference's amax):
               dL/dm = -sum_j dL/de_j e_j = -c eps / D
               e_j = exp(-m) (exp(s_j) - 1) has the sign of s_j, so the backward needs the scores, not e

``compiled=True`` runs the same two functions through torch.compile (probe.kernels.compiled: backend="compiled").
"""

from __future__ import annotations

import torch

from probe.kernels.compiled import compiled
from probe.kernels.softpick.reference import SOFTPICK_EPS


def _forward(scores: torch.Tensor, eps: float):
    """a (B,H,Tq,Tk) and what the backward keeps besides the scores: D, m and the row max (each B,H,Tq,1)."""
    top = scores.amax(-1, keepdim=True)  # B,H,Tq,1
    m = top.clamp_min(0.0)
    e = torch.exp(scores - m).sub_(torch.exp(-m)).masked_fill_(scores == float("-inf"), 0.0)  # B,H,Tq,Tk
    den = e.abs().sum(-1, keepdim=True).add_(eps)
    return e.clamp_min_(0.0).div_(den), den, m, top


def _backward(grad, scores, a, den, m, top, eps: float) -> torch.Tensor:
    """dL/ds (B,H,Tq,Tk) from g = dL/da, without e: e = exp(-m) (exp(s) - 1) has the sign of s, and exp(s - m) is
    recomputed (on hidden keys it is 0, so their gradient is). m's gradient is shared by the keys at the row max, as
    autograd shares an amax's (the reference's)."""
    c = (grad * a).sum(-1, keepdim=True)
    ge = grad.masked_fill(scores <= 0, 0.0).sub_(c * torch.sign(scores)).div_(den)
    gs = ge.mul_(torch.exp(scores - m))
    at_max = scores == top
    gm = (-eps * c / den).masked_fill_(top <= 0, 0.0)  # through the shift m = max_j s_j, where m > 0
    return gs.addcmul_(at_max, gm / at_max.sum(-1, keepdim=True))


class _Softpick(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores: torch.Tensor, eps: float, on: bool) -> torch.Tensor:
        a, *kept = compiled(_forward, on)(scores, eps)
        ctx.eps, ctx.on = eps, on
        ctx.save_for_backward(scores, a, *kept)  # scores: the blocks' caller keeps them anyway
        return a

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        scores, a, den, m, top = ctx.saved_tensors
        return compiled(_backward, ctx.on)(grad, scores, a, den, m, top, ctx.eps), None, None


def softpick_of_scores_fused(scores: torch.Tensor, eps: float = SOFTPICK_EPS, compiled: bool = False) -> torch.Tensor:
    """reference.softpick_of_scores, the same values, with the backward above (compiled: through torch.compile)."""
    return _Softpick.apply(scores, eps, compiled)
