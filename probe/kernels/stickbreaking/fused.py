"""The stick-breaking rule (reference.py's ``stickbreaking_of_scores``) as one autograd function with the backward
written out: it keeps beta and the weights (the weights are the tensor the value product keeps anyway), where autograd
through the reference keeps every log-space intermediate.

    forward    A_ij = beta_ij * prod_{k > j} (1 - beta_ik), beta = sigmoid(s): the rule as the paper writes it, a
               reversed cumulative product of 1 - beta = sigmoid(-s). Hidden keys need no mask: s = -inf gives
               beta = 0 (no weight) and 1 - beta = 1 (nothing broken).
    backward   with g the gradient on A and u_ij = g_ij A_ij (the gradient on log A_ij):
               d log A_ij / d s_ik = [k = j] - beta_ik for k >= j (log sigmoid(s)' = 1 - beta; log sigmoid(-s)' = -beta)
               so dL/ds_ik = u_ik - beta_ik sum_{j <= k} u_ij; on hidden keys u = 0 and beta = 0, so 0.

Why products rather than the reference's log space: the log form pays two transcendentals per score for log sigmoid
and an exp that is slow where it underflows (torch's eager exp is about 30x slower below -87.3, and most far keys
of a long row are there), where sigmoid is one cheap pass. A product underflows to 0 where the
log form's exp does (the weight is below fp32's smallest normal either way), and never divides, so a key that takes
the whole stick (1 - beta = 0) zeroes the keys behind it as it should. In fp32 the weights stay within about 2e-7 of
fp64's where the log form's error grew with |s| (4e-6 at |s| ~ 30; docs/definitions.md#stick-breaking-attention);
fp64 stays exact to the golden tests' 1e-12.

``compiled=True`` runs the elementwise passes on either side of the product through torch.compile
(probe.kernels.compiled: backend="compiled"). The product, sum and flips stay eager: Inductor's CPU scans in reverse
are slower than torch's cumprod between two flips. ``native=True`` runs the rule as rows.c's C kernels
(probe.kernels.native: fp32 / fp64 CPU scores, where they build; else the torch ops): each row's product and sum run
in one pass with the row in cache, and the backward recomputes beta from the scores rather than keeping it.
"""

from __future__ import annotations

from pathlib import Path

import torch

import probe.kernels.native as native_rows
from probe.kernels.common import first_order_only
from probe.kernels.compiled import compiled

ROWS = Path(__file__).with_name("rows.c")  # the C kernels


def _shares(scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.sigmoid(scores), torch.sigmoid(-scores)  # beta, 1 - beta (B,H,Tq,Tk), each to full precision


def _grad_scores(u: torch.Tensor, u_before: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    return torch.addcmul(u, beta, u_before, value=-1.0)  # u - beta cumsum(u), one pass eager


def _scratch(scores: torch.Tensor) -> torch.Tensor:
    """rows.c's scratch: (threads, 2 GROUP, n) zeros, GROUP = 4 rows run side by side."""
    return scores.new_zeros(torch.get_num_threads(), 8, scores.shape[-1])


def _native_forward(scores: torch.Tensor) -> torch.Tensor | None:
    """The weights from rows.c, or None where its kernels do not take these scores."""
    fn = native_rows.kernel_for(ROWS, "stickbreaking_forward", scores)
    if fn is None:
        return None
    n = scores.shape[-1]
    weights = torch.empty_like(scores)  # B,H,Tq,Tk
    native_rows.call(fn, scores, weights, _scratch(scores), scores.numel() // max(n, 1), n)
    return weights


def _native_backward(grad: torch.Tensor, scores: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    grad = grad.contiguous()
    ds = torch.empty_like(scores)
    fn = native_rows.kernel(ROWS, "stickbreaking_backward", scores.dtype)
    assert fn is not None  # the forward ran its twin
    native_rows.call(fn, grad, scores, weights, ds, _scratch(scores), ds.numel() // max(ds.shape[-1], 1), ds.shape[-1])
    return ds


class _StickBreaking(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores: torch.Tensor, on: bool, native: bool) -> torch.Tensor:
        ctx.on = on
        weights = _native_forward(scores) if native else None
        ctx.native = weights is not None
        if weights is not None:
            ctx.save_for_backward(scores, weights)  # scores: the blocks' caller keeps them anyway
            return weights
        beta, keep = compiled(_shares, on)(scores)  # B,H,Tq,Tk
        kept_after = keep.flip(-1).cumprod_(-1).flip(-1)  # prod_{k >= j} (1 - beta_k)
        weights = torch.empty_like(beta)
        torch.mul(beta[..., :-1], kept_after[..., 1:], out=weights[..., :-1])  # beta_j prod_{k > j}
        weights[..., -1] = beta[..., -1]  # the last key breaks the stick first
        ctx.save_for_backward(beta, weights)
        return weights

    @staticmethod
    @first_order_only
    def backward(ctx, grad: torch.Tensor):
        if ctx.native:
            scores, weights = ctx.saved_tensors
            return _native_backward(grad.to(scores.dtype), scores, weights), None, None
        beta, weights = ctx.saved_tensors
        u = grad * weights  # B,H,Tq,Tk; 0 on hidden keys
        return compiled(_grad_scores, ctx.on)(u, u.cumsum(-1), beta), None, None


def stickbreaking_of_scores_fused(scores: torch.Tensor, compiled: bool = False, native: bool = False) -> torch.Tensor:
    """reference.stickbreaking_of_scores, the same values, with the backward above (compiled: through
    torch.compile; native: rows.c's C kernels where they take the scores)."""
    return _StickBreaking.apply(scores, compiled, native)
