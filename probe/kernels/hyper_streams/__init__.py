"""Hyper-connections' stream products (probe/models/hyper.py's read and write, forward and backward) and mHC's
Sinkhorn-Knopp (probe/models/depth_mechanisms/hyper_connections.py's ``sinkhorn``) as C kernels on CPU:
``streams.c``, one pass over each token's (n, d) streams (a read, a write, or a boundary: a write and the next
read's projections), and ``sinkhorn.c``, each token's n x n steps in L1 (and mHC's post and res from its logits
around them, forward and backward); built and cached by probe.kernels.native.

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


def enabled() -> bool:
    """Are the stream kernels built and on (native kernels not switched off, a compiler found, the build done)?"""
    return native.library(SOURCE) is not None


def takes_boundary(streams, out, post, res) -> bool:
    """Do the kernels take a fused boundary of these tensors (CPU, contiguous, one dtype of fp32 / fp64)?"""
    return _kernel("boundary_forward", streams, out, post, res) is not None


def boundary_forward(streams, out, post, res, proj, groups: int, eps: float, pre=None, rule=None):
    """The write Y = H_res X + H_post ⊗ f (B,T,n,d); where ``proj`` (k, L) is given, each of Y's ``groups`` groups'
    (L = n·d / groups values) inverse rms (B,T,groups) and projections (B,T,groups,k); and the read Σ_j pre_j Y_j
    (B,T,d), with ``pre`` (B,T,n) given, or from the projections by ``rule`` = (1 sigmoid | 2 tanh, a, b (n), pre_eps,
    step) (streams.c). Returns (Y, dots, inv_rms, read, pre, slope: d pre / d logit), None for what was not
    computed; None where the kernels do not take the call."""
    code, scale, shift, pre_eps, step = rule if rule is not None else (0, 0.0, None, 0.0, 1)
    optional = tuple(t for t in (proj, pre, shift) if t is not None)
    fn = _kernel("boundary_forward", streams, out, post, res, *optional)
    if fn is None:
        return None
    *lead, n, d = streams.shape
    k = proj.shape[0] if proj is not None else 0
    new, read = torch.empty_like(streams), torch.empty_like(out)
    dots = streams.new_empty(*lead, groups, k) if k else None
    inv_rms = streams.new_empty(*lead, groups) if k else None
    pre_out, slope = (post.new_empty(post.shape), post.new_empty(post.shape)) if code else (None, None)
    native.call(
        fn, streams, out, post, res, proj, pre, shift, new, dots, inv_rms, read, pre_out, slope,
        out.numel() // max(d, 1), n, d, groups, k, code, step, eps, float(scale), float(pre_eps),
    )  # fmt: skip
    return new, dots, inv_rms, read, pre if pre is not None else pre_out, slope


def boundary_backward(grad, grad_read, pre, new, streams, out, post, res, projected=None, slope=None, step=1):
    """(grad_streams, grad_out, grad_post, grad_res, grad_pre, grad_dots) of a boundary: Y's gradient is ``grad``
    (B,T,n,d, or None) + pre ⊗ grad_read + the projection's, from ``projected`` = (proj (k, L), dots, inv_rms,
    grad_logits (B,T,groups,k): the logits' gradient from the weights other than pre); where ``slope`` (d pre / d
    logit, B,T,n) is given, pre's share is added to grad_logits in place first (the logit of pre_j the (j·step)-th of
    a token's projections). grad_dots (B,T,groups,k, None without ``projected``) is the gradient along proj's rows,
    each token's Y_g times it summing to proj's. The caller made sure the kernels take the call (``boundary_forward``
    did)."""
    grad_read = grad_read.contiguous()
    proj, dots, inv_rms, grad_logits = projected if projected is not None else (None,) * 4
    optional = tuple(t for t in (grad, proj, dots, inv_rms, slope, grad_logits) if t is not None)
    fn = _kernel("boundary_backward", grad_read, pre, new, streams, out, post, res, *optional)
    assert fn is not None  # boundary_forward took the same tensors
    *lead, n, d = streams.shape
    groups, k = (dots.shape[-2], dots.shape[-1]) if dots is not None else (1, 0)
    grads = [torch.empty_like(t) for t in (streams, out, post, res, pre)]
    grad_dots = torch.empty_like(dots) if dots is not None else None
    failed = native.call(
        fn, grad, grad_read, pre, new, streams, out, post, res, proj, dots, inv_rms, slope, grad_logits, grad_dots,
        *grads, out.numel() // max(d, 1), n, d, groups, k, step,
    )  # fmt: skip
    if failed:
        raise MemoryError("hyper-connection boundary backward: no memory for a token's stream gradient")
    return (*grads, grad_dots)


MAX_STEP_ENTRIES = 65536  # sinkhorn.c's workspace limit per token (x 16 side by side): (2 iters + 2) n (n + 1)


def takes_sinkhorn(logits: torch.Tensor, iters: int) -> bool:
    """Do the C kernels take Sinkhorn on these logits (..., n, n): CPU, contiguous, fp32 / fp64, built, small enough
    for a token's steps on the stack?"""
    return _steps_fit(logits.shape[-1], iters) and _kernel("sinkhorn_forward", logits, source=SINKHORN) is not None


def _steps_fit(n: int, iters: int) -> bool:
    """Do a token's Sinkhorn steps (n x n entries, ``iters`` iterations) fit the kernels' workspace?"""
    return (2 * iters + 2) * n * (n + 1) <= MAX_STEP_ENTRIES


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


def takes_mhc_weights(like: torch.Tensor, n: int, iters: int) -> bool:
    """Do the C kernels take mHC's weights (n streams, ``iters`` Sinkhorn iterations) for tensors like ``like``
    (CPU, fp32 / fp64, built; the steps within the kernels' workspace, as ``takes_sinkhorn``)?"""
    return _steps_fit(n, iters) and _kernel("mhc_weights_forward", like, source=SINKHORN) is not None


def mhc_weights_forward(logits, bias, scale, n: int, iters: int, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """mHC's post (..., n) and res (..., n_out, n_in) from its logits z (..., (2 + n) n), u = z s + b per part
    (``scale``: 3, ``bias``: (2 + n) n); ``takes_mhc_weights`` said yes."""
    fn = _kernel("mhc_weights_forward", logits, bias, scale, source=SINKHORN)
    assert fn is not None  # takes_mhc_weights said yes
    lead = logits.shape[:-1]
    post, res = logits.new_empty(*lead, n), logits.new_empty(*lead, n, n)
    failed = native.call(fn, logits, bias, scale, post, res, post.numel() // n, n, iters, eps)
    assert not failed  # within MAX_STEP_ENTRIES, as takes_mhc_weights checked
    return post, res


def mhc_weights_backward(logits, bias, scale, n: int, iters: int, eps: float, grads, sums, grad_logits: bool):
    """The logits' gradient (..., (2 + n) n; pre's part 0) from the weights' ``grads`` = (pre, post, res), each None
    where there is none, or None where ``grad_logits`` is False; the bias's and scales' gradients are added to
    ``sums`` = (bias's, scale's), zero-initialised by the caller."""
    fn = _kernel("mhc_weights_backward", logits, bias, scale, *sums, source=SINKHORN)
    assert fn is not None  # takes_mhc_weights said yes
    grads = tuple(None if g is None else g.contiguous().to(logits.dtype) for g in grads)
    out = torch.empty_like(logits) if grad_logits else None
    failed = native.call(fn, logits, bias, scale, *grads, out, *sums, logits.numel() // logits.shape[-1], n, iters, eps)
    if failed:
        raise MemoryError("mHC weights backward: no memory for the threads' sums")
    return out
