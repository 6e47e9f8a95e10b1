"""The stick-breaking rule (reference.py's ``stickbreaking_of_scores``) as one autograd function with the backward
written out: it keeps the scores and the weights (the weights are the tensor the value product keeps anyway), where
autograd through the reference keeps every log-space intermediate.

    forward    log sigmoid(s) - log sigmoid(-s) = s, so log A_ij = s_ij + sum_{k >= j} log sigmoid(-s_ik): one
               transcendental and one (inclusive, reversed) cumulative sum. Hidden keys need no mask: s = -inf gives
               log sigmoid(+inf) = 0 to the sum and A = exp(-inf) = 0.
    backward   with g the gradient on A and u_ij = g_ij A_ij (the gradient on log A_ij):
               d log A_ij / d s_ik = [k = j] - beta_ik for k >= j      (beta = sigmoid(s); log sigmoid(-s)' = -beta)
               so dL/ds_ik = u_ik - beta_ik sum_{j <= k} u_ij; on hidden keys u = 0 and beta = 0, so 0.

The identity trades the reference's log sigmoid(s_ij) for s_ij plus one more term of the sum: in fp32 log A carries an
absolute error of about 6e-8 |s_ij| more than the reference's (at |s| = 30, 2e-6 relative in A); fp64 stays exact.

``compiled=True`` runs the same two functions through torch.compile (probe.kernels.compiled: backend="compiled").
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from probe.kernels.compiled import compiled


# The elementwise passes on either side of each cumulative sum: compiled where asked. The sums and flips stay eager:
# Inductor's CPU scans and reversed writes are slower than torch's cumsum and flip.
def _log_keep(scores: torch.Tensor) -> torch.Tensor:
    return F.logsigmoid(-scores)  # B,H,Tq,Tk: log(1 - beta), 0 on hidden keys


def _weights(kept_after: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    return kept_after.add_(scores).exp_()  # exp(s_j + sum_{k >= j} log_keep_k)


def _grad_scores(u: torch.Tensor, u_before: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(scores).mul_(u_before).neg_().add_(u)  # u - beta cumsum(u)


class _StickBreaking(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores: torch.Tensor, on: bool) -> torch.Tensor:
        kept_after = compiled(_log_keep, on)(scores).flip(-1).cumsum_(-1).flip(-1)  # B,H,Tq,Tk: sum over k >= j
        weights = compiled(_weights, on)(kept_after, scores)
        ctx.on = on
        ctx.save_for_backward(scores, weights)
        return weights

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        scores, weights = ctx.saved_tensors
        u = grad * weights  # B,H,Tq,Tk; 0 on hidden keys
        return compiled(_grad_scores, ctx.on)(u, u.cumsum(-1), scores), None


def stickbreaking_of_scores_fused(scores: torch.Tensor, compiled: bool = False) -> torch.Tensor:
    """reference.stickbreaking_of_scores, the same values, with the backward above (compiled: through
    torch.compile)."""
    return _StickBreaking.apply(scores, compiled)
