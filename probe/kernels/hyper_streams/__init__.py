"""Hyper-connections' stream products (probe/models/hyper.py's read and write, forward and backward) and mHC's
Sinkhorn-Knopp (probe/models/depth_mechanisms/hyper_connections.py's ``sinkhorn``) as C kernels on CPU:
``streams.c``, one pass over each token's (n, d) streams, and ``sinkhorn.c``, each token's n x n steps in L1; built
and cached by probe.kernels.native.

Each function returns None where the kernels do not take the call (a non-CPU tensor, a dtype other than fp32 / fp64,
mixed dtypes, native kernels off or not built, or a runtime backend other than "auto"): the caller runs its torch
products then. The kernels compute the same sums as those products, in another order (tests/models/test_hyper.py
compares them, values and gradients).
"""

from __future__ import annotations

from pathlib import Path

import torch

import probe.kernels.native as native
from probe.kernels.backend import current_backend

SOURCE = Path(__file__).with_name("streams.c")
SINKHORN = Path(__file__).with_name("sinkhorn.c")


def _kernel(name: str, *tensors: torch.Tensor, source: Path = SOURCE):
    return native.kernel_for(source, name, *tensors) if current_backend() == "auto" else None


def read_forward(weights: torch.Tensor, streams: torch.Tensor) -> torch.Tensor | None:
    """Σ_j w[j] X_j: weights (B,T,n), streams (B,T,n,d) -> (B,T,d)."""
    fn = _kernel("read_forward", weights, streams)
    if fn is None:
        return None
    *lead, n, d = streams.shape
    out = streams.new_empty(*lead, d)
    native.call(fn, weights, streams, out, out.numel() // max(d, 1), n, d)
    return out


def read_backward(weights, streams, grad: torch.Tensor, need_weights: bool, need_streams: bool):
    """(grad_weights (B,T,n) or None, grad_streams (B,T,n,d) or None) of the read, from grad (B,T,d); None where the
    kernels do not take the call."""
    grad = grad.contiguous()
    fn = _kernel("read_backward", weights, streams, grad)
    if fn is None:
        return None
    *lead, n, d = streams.shape
    gw = torch.empty_like(weights) if need_weights else None
    gx = torch.empty_like(streams) if need_streams else None
    native.call(fn, weights, streams, grad, gw, gx, grad.numel() // max(d, 1), n, d)
    return gw, gx


def write_forward(streams, out, post, res) -> torch.Tensor | None:
    """H_res X + H_post ⊗ f: streams (B,T,n,d), out (B,T,d), post (B,T,n), res (B,T,n,n) out × in -> (B,T,n,d)."""
    fn = _kernel("write_forward", streams, out, post, res)
    if fn is None:
        return None
    *lead, n, d = streams.shape
    new = torch.empty_like(streams)
    native.call(fn, streams, out, post, res, new, out.numel() // max(d, 1), n, d)
    return new


def write_backward(grad, streams, out, post, res, needs: tuple[bool, bool, bool, bool]):
    """(grad_streams, grad_out, grad_post, grad_res), each None where ``needs`` says it is not asked for, from grad
    (B,T,n,d); None where the kernels do not take the call."""
    grad = grad.contiguous()
    fn = _kernel("write_backward", grad, streams, out, post, res)
    if fn is None:
        return None
    *lead, n, d = streams.shape
    grads = [torch.empty_like(t) if need else None for t, need in zip((streams, out, post, res), needs, strict=True)]
    native.call(fn, grad, streams, out, post, res, *grads, out.numel() // max(d, 1), n, d)
    return tuple(grads)


MAX_STEP_ENTRIES = 65536  # sinkhorn.c's stack limit per token: (2 iters + 2) n (n + 1) entries


def takes_sinkhorn(logits: torch.Tensor, iters: int) -> bool:
    """Do the C kernels take Sinkhorn on these logits (..., n, n): CPU, contiguous, fp32 / fp64, built, small enough
    for a token's steps on the stack?"""
    n = logits.shape[-1]
    fits = (2 * iters + 2) * n * (n + 1) <= MAX_STEP_ENTRIES
    return fits and _kernel("sinkhorn_forward", logits, source=SINKHORN) is not None


def sinkhorn_forward(logits: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """Sinkhorn's output (..., n_out, n_in) of logits (..., n_in, n_out); ``takes_sinkhorn`` said yes."""
    return _sinkhorn("sinkhorn_forward", logits, iters, eps)


def sinkhorn_backward(logits: torch.Tensor, grad: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """The logits' gradient (..., n_in, n_out) from the output's (..., n_out, n_in)."""
    return _sinkhorn("sinkhorn_backward", logits, iters, eps, grad.contiguous().to(logits.dtype))


def _sinkhorn(name: str, logits: torch.Tensor, iters: int, eps: float, *grad: torch.Tensor) -> torch.Tensor:
    fn = _kernel(name, logits, source=SINKHORN)
    assert fn is not None  # takes_sinkhorn said yes
    n = logits.shape[-1]
    out = torch.empty_like(logits)
    failed = native.call(fn, logits, *grad, out, logits.numel() // max(n * n, 1), n, iters, eps)
    assert not failed  # within MAX_STEP_ENTRIES, as takes_sinkhorn checked
    return out
