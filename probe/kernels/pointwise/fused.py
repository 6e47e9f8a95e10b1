"""The pointwise rules (reference.py's ``pointwise_of_scores``) as one autograd function with the backward written
out, so a forward + backward makes fewer (B, H, Tq, Tk) passes than autograd through the reference does.

    forward    w_j = f(s_j + b) (hidden keys: f(-inf) = 0), a_j = w_j, or w_j / D with D = sum_j w_j + eps
    backward   f' from w alone: sigmoid' = w (1 - w); (elu + 1)' = 1 where w > 1 (x > 0), else w (= exp(x));
               both 0 on hidden keys, whose w is 0. With g the gradient on a:
               not normalised  dL/ds_j = g_j f'_j
               normalised      dL/ds_j = (g_j - c) f'_j / D,  c = sum_k g_k a_k
"""

from __future__ import annotations

import torch

from probe.kernels.pointwise.reference import NORM_EPS, kernel_of


def _derivative(w: torch.Tensor, kernel: str) -> torch.Tensor:
    """f'(x) of the kernel, from its value w = f(x), in a new tensor (callers scale it in place)."""
    if kernel == "sigmoid":
        return (1.0 - w).mul_(w)
    return w.clamp_max(1.0)  # 1 where w > 1, else w


class _Pointwise(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores: torch.Tensor, kernel: str, normalise: bool, bias: float, eps: float) -> torch.Tensor:
        w = kernel_of(scores + bias if bias else scores, kernel)  # hidden keys: -inf + b -> f(-inf) = 0
        ctx.kernel, ctx.normalise = kernel, normalise
        if not normalise:
            ctx.save_for_backward(w)
            return w
        den = w.sum(-1, keepdim=True).add_(eps)  # B,H,Tq,1
        ctx.save_for_backward(w, den)
        return w / den

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        if not ctx.normalise:
            (w,) = ctx.saved_tensors
            return _derivative(w, ctx.kernel).mul_(grad), None, None, None, None
        w, den = ctx.saved_tensors
        c = (grad * w).sum(-1, keepdim=True).div_(den)  # sum_k g_k a_k
        gs = (grad - c).mul_(_derivative(w, ctx.kernel)).div_(den)
        return gs, None, None, None, None


def pointwise_of_scores_fused(
    scores: torch.Tensor, kernel: str, normalise: bool, bias: float = 0.0, eps: float = NORM_EPS
) -> torch.Tensor:
    """reference.pointwise_of_scores, the same values, with the backward above."""
    return _Pointwise.apply(scores, kernel, normalise, bias, eps)
