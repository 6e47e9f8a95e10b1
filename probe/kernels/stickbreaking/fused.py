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
are slower than torch's cumprod between two flips.
"""

from __future__ import annotations

import torch

from probe.kernels.compiled import compiled


def _shares(scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.sigmoid(scores), torch.sigmoid(-scores)  # beta, 1 - beta (B,H,Tq,Tk), each to full precision


def _grad_scores(u: torch.Tensor, u_before: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    return torch.addcmul(u, beta, u_before, value=-1.0)  # u - beta cumsum(u), one pass eager


class _StickBreaking(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores: torch.Tensor, on: bool) -> torch.Tensor:
        beta, keep = compiled(_shares, on)(scores)  # B,H,Tq,Tk
        kept_after = keep.flip(-1).cumprod_(-1).flip(-1)  # prod_{k >= j} (1 - beta_k)
        weights = torch.empty_like(beta)
        torch.mul(beta[..., :-1], kept_after[..., 1:], out=weights[..., :-1])  # beta_j prod_{k > j}
        weights[..., -1] = beta[..., -1]  # the last key breaks the stick first
        ctx.on = on
        ctx.save_for_backward(beta, weights)
        return weights

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        beta, weights = ctx.saved_tensors
        u = grad * weights  # B,H,Tq,Tk; 0 on hidden keys
        return compiled(_grad_scores, ctx.on)(u, u.cumsum(-1), beta), None


def stickbreaking_of_scores_fused(scores: torch.Tensor, compiled: bool = False) -> torch.Tensor:
    """reference.stickbreaking_of_scores, the same values, with the backward above (compiled: through
    torch.compile)."""
    return _StickBreaking.apply(scores, compiled)
