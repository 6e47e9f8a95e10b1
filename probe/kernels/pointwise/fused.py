"""The pointwise rules (reference.py's ``pointwise_of_scores``) as one autograd function with the backward written
out, so a forward + backward makes fewer (B, H, Tq, Tk) passes than autograd through the reference does.

    forward    w_j = f(s_j + b) (hidden keys: f(-inf) = 0), a_j = w_j, or w_j / D with D = sum_j w_j + eps
    backward   f' from w alone: sigmoid' = w (1 - w); (elu + 1)' = 1 where w > 1 (x > 0), else w (= exp(x));
               both 0 on hidden keys, whose w is 0. With g the gradient on a:
               not normalised  dL/ds_j = g_j f'_j
               normalised      dL/ds_j = (g_j - c) f'_j / D,  c = sum_k g_k a_k

``compiled=True`` runs the same two functions through torch.compile (probe.kernels.compiled: backend="compiled").
"""

from __future__ import annotations

import torch

from probe.kernels.common import first_order_only
from probe.kernels.compiled import compiled
from probe.kernels.pointwise.reference import NORM_EPS, kernel_of


def _derivative(w: torch.Tensor, kernel: str) -> torch.Tensor:
    """f'(x) of the kernel, from its value w = f(x), in a new tensor (callers scale it in place)."""
    if kernel == "sigmoid":
        return (1.0 - w).mul_(w)
    return w.clamp_max(1.0)  # 1 where w > 1, else w


def _forward(scores: torch.Tensor, kernel: str, normalise: bool, bias: float, eps: float) -> tuple:
    """(a,) unnormalised (a = w = f(s + b)), else (a, D): a (B,H,Tq,Tk), D (B,H,Tq,1) = sum_j w_j + eps."""
    w = kernel_of(scores + bias if bias else scores, kernel)  # hidden keys: -inf + b -> f(-inf) = 0
    if not normalise:
        return (w,)
    den = w.sum(-1, keepdim=True).add_(eps)  # B,H,Tq,1
    return w.div_(den), den  # w becomes a: the backward takes w back as a D


def _backward(grad: torch.Tensor, kernel: str, a: torch.Tensor, den: torch.Tensor | None = None) -> torch.Tensor:
    """dL/ds (B,H,Tq,Tk) from g = dL/da: unnormalised where den is None (then a = w)."""
    if den is None:
        return _derivative(a, kernel).mul_(grad)
    c = (grad * a).sum(-1, keepdim=True)  # sum_k g_k a_k
    return (grad - c).mul_(_derivative(a * den, kernel)).div_(den)


class _Pointwise(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores, kernel: str, normalise: bool, bias: float, eps: float, on: bool) -> torch.Tensor:
        out = compiled(_forward, on)(scores, kernel, normalise, bias, eps)
        ctx.kernel, ctx.on = kernel, on
        ctx.save_for_backward(*out)  # a (unnormalised: a = w), or a and D
        return out[0]

    @staticmethod
    @first_order_only
    def backward(ctx, grad: torch.Tensor):
        gs = compiled(_backward, ctx.on)(grad, ctx.kernel, *ctx.saved_tensors)
        return gs, None, None, None, None, None


def pointwise_of_scores_fused(
    scores: torch.Tensor,
    kernel: str,
    normalise: bool,
    bias: float = 0.0,
    eps: float = NORM_EPS,
    compiled: bool = False,
) -> torch.Tensor:
    """reference.pointwise_of_scores, the same values, with the backward above (compiled: through torch.compile)."""
    return _Pointwise.apply(scores, kernel, normalise, bias, eps, compiled)
