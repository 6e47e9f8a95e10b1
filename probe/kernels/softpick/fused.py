"""softpick's rule (reference.py's ``softpick_of_scores``) as one autograd function with its backward written out,
so a forward + backward makes fewer (B, H, Tq, Tk) passes than autograd through the reference does.

    forward    m = max(0, max_j s_j), e_j = exp(s_j - m) - exp(-m) (0 where hidden), D = sum_j |e_j| + eps,
               a_j = relu(e_j) / D
    backward   with g the gradient on a and c = sum_j g_j a_j:
               dL/de_j = (g_j [e_j > 0] - c sign(e_j)) / D,  dL/ds_j = dL/de_j exp(s_j - m)  (visible j)
               and through m (where m > 0; its gradient is shared by the keys at the max, as for the reference's amax):
               dL/dm = -sum_j dL/de_j e_j = -c eps / D
               e_j = exp(-m) (exp(s_j) - 1) has the sign of s_j, so the backward needs the scores, not e

``compiled=True`` runs the same two functions through torch.compile (probe.kernels.compiled: backend="compiled");
``native=True`` runs them as rows.c's C kernels (probe.kernels.native: fp32 / fp64 CPU scores, where they build; else
the torch ops), which keep the same D, m and row max per row.
"""

from __future__ import annotations

from pathlib import Path

import torch

import probe.kernels.native as native_rows
from probe.kernels.common import first_order_only
from probe.kernels.compiled import compiled
from probe.kernels.softpick.reference import SOFTPICK_EPS

ROWS = Path(__file__).with_name("rows.c")  # the C kernels


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


def _native_forward(scores: torch.Tensor, eps: float):
    """_forward's outputs from rows.c, or None where its kernels do not take these scores."""
    fn = native_rows.kernel_for(ROWS, "softpick_forward", scores)
    if fn is None:
        return None
    a = torch.empty_like(scores)  # B,H,Tq,Tk
    den, m, top = (scores.new_empty(scores.shape[:-1] + (1,)) for _ in range(3))  # B,H,Tq,1 each
    native_rows.call(fn, scores, a, den, m, top, scores.numel() // max(scores.shape[-1], 1), scores.shape[-1], eps)
    return a, den, m, top


def _native_backward(grad, scores, a, den, m, top, eps: float) -> torch.Tensor:
    grad = grad.contiguous()
    ds = torch.empty_like(scores)
    fn = native_rows.kernel(ROWS, "softpick_backward", scores.dtype)
    assert fn is not None  # the forward ran its twin
    native_rows.call(fn, grad, scores, a, den, m, top, ds, ds.numel() // max(ds.shape[-1], 1), ds.shape[-1], eps)
    return ds


class _Softpick(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores: torch.Tensor, eps: float, on: bool, native: bool) -> torch.Tensor:
        outputs = _native_forward(scores, eps) if native else None
        ctx.native = outputs is not None
        a, *kept = outputs if outputs is not None else compiled(_forward, on)(scores, eps)
        ctx.eps, ctx.on = eps, on
        ctx.save_for_backward(scores, a, *kept)  # scores: the blocks' caller keeps them anyway
        return a

    @staticmethod
    @first_order_only
    def backward(ctx, grad: torch.Tensor):
        scores, a, den, m, top = ctx.saved_tensors
        if ctx.native:
            return _native_backward(grad.to(scores.dtype), scores, a, den, m, top, ctx.eps), None, None, None
        return compiled(_backward, ctx.on)(grad, scores, a, den, m, top, ctx.eps), None, None, None


def softpick_of_scores_fused(
    scores: torch.Tensor, eps: float = SOFTPICK_EPS, compiled: bool = False, native: bool = False
) -> torch.Tensor:
    """reference.softpick_of_scores, the same values, with the backward above (compiled: through torch.compile;
    native: rows.c's C kernels where they take the scores)."""
    return _Softpick.apply(scores, eps, compiled, native)
