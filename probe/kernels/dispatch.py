"""One entry point per op; picks the reference, the fused torch path (SDPA / CPU flash) or the Triton kernel.

backend    sink_attention                   depth_attention           attention_row_masses
auto       pattern -> reference;            CUDA + triton -> triton;  CUDA + triton -> triton;
           CUDA + triton, no mask -> triton; else reference            CPU, no window, no softcap -> CPU
           else sdpa                                                  flash; else chunked
torch      pattern -> reference; else sdpa reference                 CPU flash or chunked (softcap: chunked)
reference  T x T fp32 reference             reference                 T x T reference
sdpa       fused SDPA (no pattern)          reference (no SDPA form)  CPU flash or chunked (softcap: chunked)
triton     Triton kernel: CUDA tensors, or CPU tensors under TRITON_INTERPRET=1 (set before importing triton)
sink_attention takes the kept-first-keys rule natively (``keep`` with a ``window``) on every path, and carries out an
attention edit armed for it (probe.kernels.sink_attention.edits: key-0 knockout, window eviction) through its own
per-key bias and that rule.
``backend=None`` (the default) is the runtime choice: ``use_backend(...)``, else $PROBE_BACKEND, else auto
(probe.kernels.backend). Triton is imported only when a Triton path is taken.

Fallback: when no launch setting of a Triton kernel fits the device's shared memory (probe.kernels.launch), the op
runs its torch path instead (sink_attention: sdpa; attention_row_masses: chunked; depth_attention: the reference
loop; never the T x T reference), with one warning per shape: never an OutOfResources.
"""

from __future__ import annotations

import functools
import math
import os
import warnings
from collections.abc import Sequence
from typing import NamedTuple

import torch

from probe.kernels.backend import resolve_backend
from probe.kernels.depth_attention.reference import check_sources, depth_attention_reference, depth_scores
from probe.kernels.launch import NoLaunchConfig
from probe.kernels.sink_attention import edits
from probe.kernels.sink_attention.reference import real_lse_blocked, sink_attention_reference, visible_mask
from probe.kernels.sink_attention.row_masses import (
    row_masses_chunked,
    row_masses_flash_cpu,
    row_masses_reference,
    row_masses_sparse,
    row_masses_triton,
)
from probe.kernels.sink_attention.sdpa import _cpu_flash, sink_attention_sdpa

_TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class AttentionOutput(NamedTuple):
    out: torch.Tensor  # (B, Tq, H, dv) in q.dtype
    lse: torch.Tensor | None  # (B, H, Tq) fp32, log(exp(sink) + Σ_visible exp(score)); None on sdpa under autograd
    pattern: torch.Tensor | None  # (B, H, Tq, Tk) fp32 over real keys, rows sum to 1 - phantom (return_pattern)
    phantom: torch.Tensor | None  # (B, H, Tq) fp32 mass on the phantom key (return_pattern)
    lse_real: torch.Tensor | None = None  # (B, H, Tq) fp32 log Σ_visible exp(score), phantom excluded (return_lse)


class DepthOutput(NamedTuple):
    h: torch.Tensor  # (B, T, d) in values' dtype
    lse: torch.Tensor  # (B, T) fp32
    weights: torch.Tensor | None  # (B, T, S) fp32 (return_weights)


@functools.cache
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _triton_on(device: torch.device) -> bool:
    """Can a Triton kernel run on tensors of this device? (explicit backend='triton' raises otherwise)"""
    if not triton_available():
        raise RuntimeError("backend='triton' needs the triton package (pip install 'probe-attn[triton]')")
    if device.type == "cuda":
        return True
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return True
    raise RuntimeError(
        f"backend='triton' runs on CUDA tensors, or on CPU tensors only with TRITON_INTERPRET=1 set "
        f"before triton is imported; got {device.type} tensors"
    )


_fallbacks_warned: set[str] = set()


def warn_fallback(error: NoLaunchConfig, path: str) -> None:
    """One warning per distinct shape that takes the torch path because no Triton launch fits the device."""
    message = f"{error}; using the {path} path instead"
    if message not in _fallbacks_warned:
        _fallbacks_warned.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def _check_attention_args(q, k, v, sink, key_bias, window, mask=None, keep=None):
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("expected q (B,Tq,H,dh), k (B,Tk,Hkv,dh), v (B,Tk,Hkv,dv)")
    B, Tq, H, dh = q.shape
    Tk = k.shape[1]
    if k.shape[0] != B or Tk < Tq or v.shape[:3] != k.shape[:3] or k.shape[-1] != dh:
        raise ValueError(f"shape mismatch: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if H % k.shape[2]:
        raise ValueError(f"query heads ({H}) must be a multiple of kv heads ({k.shape[2]})")
    if sink is not None and sink.shape != (H,):
        raise ValueError(f"sink must have shape ({H},), got {tuple(sink.shape)}")
    if key_bias is not None and key_bias.shape != (B, k.shape[2], Tk):
        raise ValueError(f"key_bias must have shape ({B}, {k.shape[2]}, {Tk}), got {tuple(key_bias.shape)}")
    if window is not None and (int(window) != window or window < 1):
        raise ValueError(f"window must be a positive int or None, got {window!r}")
    if keep is not None and (window is None or int(keep) != keep or keep < 0):
        raise ValueError(
            f"keep (kept first keys) must be an int >= 0 with a window, got keep={keep!r}, window={window!r}"
        )
    if mask is not None and (mask.dim() != 4 or mask.shape[-2:] != (Tq, Tk)):
        raise ValueError(f"mask must broadcast to (B, H, {Tq}, {Tk}), got {tuple(mask.shape)}")


def auto_sink_attention(q, k, v, *, mask=None, return_pattern=False) -> str:
    """The path backend="auto" takes for these tensors: "reference" (a pattern is asked for), "triton" or "sdpa"."""
    if return_pattern:
        return "reference"
    if (
        q.device.type == "cuda"
        and triton_available()
        and q.dtype in _TRITON_DTYPES
        and mask is None
        and q.shape[1] == k.shape[1]
        and max(q.shape[-1], v.shape[-1]) <= 256
    ):
        return "triton"
    return "sdpa"


def auto_row_masses(q, *, window=None, softcap=None) -> str:
    """The path backend="auto" takes for attention_row_masses on q: "triton", "flash" (CPU) or "chunked"."""
    if q.device.type == "cuda" and triton_available() and q.dtype in _TRITON_DTYPES:
        return "triton"
    if q.device.type == "cpu" and window is None and softcap is None and _cpu_flash is not None:
        return "flash"
    return "chunked"


def sink_attention(
    q,
    k,
    v,
    *,
    sink=None,
    key_bias=None,
    mask=None,
    window=None,
    scale=None,
    keep=None,
    return_pattern=False,
    return_lse=False,
    backend=None,
) -> AttentionOutput:
    """Causal (optionally sliding-window) GQA attention with an optional phantom sink key and per-key logit bias.

    q (B,Tq,H,dh), k (B,Tk,Hkv,dh), v (B,Tk,Hkv,dv) with Tq <= Tk (queries are the last Tq positions); query head h
    reads kv head h // (H // Hkv); key j is visible to query i iff i - window < j <= i. sink (H,): phantom logit per
    query head, value 0 (None = no phantom = -inf). key_bias (B,Hkv,Tk): extra additive logit per key (the routing
    slot's log g_j). mask: additive logits broadcastable to (B,H,Tq,Tk) that replace the causal/window rule (HF
    padding masks; not on Triton). scale defaults to 1/sqrt(dh). Value gates are the caller's: v is aggregated as given.
    keep: with a window, keys j < keep stay visible to every later query (the kept-first-keys rule).
    return_lse: also give ``lse_real``, each row's lse over the real keys (docs/definitions.md#row-log-normaliser):
    the fused kernel's own where it has one, else computed in query blocks.
    An edit armed for this call (probe.kernels.sink_attention.edits.arm) is carried out here.
    """
    edit = edits.take()
    if edit is not None:
        return _edited_attention(
            edit,
            q,
            k,
            v,
            sink=sink,
            key_bias=key_bias,
            mask=mask,
            window=window,
            scale=scale,
            keep=keep,
            return_pattern=return_pattern,
            return_lse=return_lse,
            backend=backend,
        )
    res = _sink_attention(q, k, v, sink, key_bias, mask, window, scale, keep, return_pattern, backend)
    if not return_lse or res.lse_real is not None:
        return res
    if sink is None and res.lse is not None:  # without a phantom the kernel's lse is over the real keys
        return res._replace(lse_real=res.lse)
    return res._replace(lse_real=_real_lse(q, k, sink, key_bias, mask, window, scale, keep, backend))


def _real_lse(q, k, sink, key_bias, mask, window, scale, keep, backend) -> torch.Tensor:
    """lse over the real keys where the attention's path did not give it: log of the real mass the row-mass op sums
    (well conditioned however much the phantom takes; fp32), or with a mask, a cache, kept first keys or fp64 inputs,
    query blocks."""
    if mask is not None or keep is not None or q.shape[1] != k.shape[1] or q.dtype == torch.float64:
        real = real_lse_blocked(q, k, key_bias=key_bias, mask=mask, window=window, scale=scale, keep=keep)
        return real if q.dtype == torch.float64 else real.float()  # fp64 inputs keep fp64, as the reference does
    every = q.new_ones(*k.shape[:3], 1, dtype=torch.float32)  # (B, T, Hkv, 1)
    with torch.no_grad():
        lse, mass = attention_row_masses(
            q, k, every, sink=sink, key_bias=key_bias, window=window, scale=scale, backend=backend
        )
    return lse.float() + torch.log(mass[..., 0].float())


def _sink_attention(q, k, v, sink, key_bias, mask, window, scale, keep, return_pattern, backend) -> AttentionOutput:
    backend = resolve_backend(backend)
    _check_attention_args(q, k, v, sink, key_bias, window, mask, keep)
    window = None if window is None else int(window)
    keep = None if keep is None or window is None else int(keep)
    kw = dict(sink=sink, key_bias=key_bias, window=window, scale=scale, keep=keep)
    if backend in ("sdpa", "triton") and return_pattern:
        raise ValueError(f"backend={backend!r} cannot return the pattern; use 'reference', 'torch' or 'auto'")
    if backend == "auto":
        backend = auto_sink_attention(q, k, v, mask=mask, return_pattern=return_pattern)
    elif backend == "torch":
        backend = "reference" if return_pattern else "sdpa"

    if backend == "reference":
        return AttentionOutput(*sink_attention_reference(q, k, v, mask=mask, return_pattern=return_pattern, **kw))
    if backend == "sdpa":
        out, lse, real = sink_attention_sdpa(q, k, v, mask=mask, **kw)
        return AttentionOutput(out, lse, None, None, real)
    if mask is not None or q.shape[1] != k.shape[1]:
        raise ValueError("backend='triton' runs causal/window attention over one sequence: no mask, Tq == Tk")
    _triton_on(q.device)
    from probe.kernels.sink_attention.triton import sink_attention_triton

    try:
        return AttentionOutput(*sink_attention_triton(q, k, v, **kw), None, None)
    except NoLaunchConfig as e:
        warn_fallback(e, "sdpa")
        out, lse, real = sink_attention_sdpa(q, k, v, mask=None, **kw)
        return AttentionOutput(out, lse, None, None, real)


def _edited_attention(edit, q, k, v, *, sink, key_bias, mask, window, scale, keep, return_pattern, return_lse, backend):
    """sink_attention with an armed edit carried out by the op's own per-key bias and kept-first-keys rule."""
    if keep is not None:
        raise ValueError("an armed eviction cannot be combined with the caller's own keep")
    B, Tq, H, _ = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    if Tq != Tk:  # a cache, or a layer split into query blocks: key 0 and the positions are not the window's own
        raise RuntimeError(
            f"an attention edit needs the whole sequence in one attention call; got {Tq} queries over {Tk} keys"
        )
    if edit.keep is not None:
        if mask is None:
            window, keep, both = edits.eviction_rule(window, edit, Tk)
            if both is not None:  # kept keys inside a wider own window than the eviction's
                mask = torch.zeros(Tk, Tk, device=q.device).masked_fill(~both.to(q.device), float("-inf"))[None, None]
        else:  # an additive mask (HF's dense one): the rule joins it
            visible = visible_mask(Tq, edit.window, q.device, Tk, edit.keep)
            mask = mask.float().masked_fill(~visible, float("-inf"))
    bias = key_bias
    if edit.knockout:
        bias = edits.knockout_bias(key_bias, B, Hkv, Tk, edit.kv_heads, q.device)
    res = sink_attention(
        q,
        k,
        v,
        sink=sink,
        key_bias=bias,
        mask=mask,
        window=window,
        scale=scale,
        keep=keep,
        return_pattern=return_pattern,
        return_lse=return_lse,
        backend=backend,
    )
    if not edit.knockout:
        return res
    empty = edits.empty_first_rows(sink, H, Hkv, edit.kv_heads, q.device)  # (H,)
    if not bool(empty.any()):
        return res
    first = sink_attention(
        q[:, :1],
        k[:, :1],
        v[:, :1],
        sink=sink,  # query 0 over key 0 alone: its clean row
        key_bias=None if key_bias is None else key_bias[..., :1],
        mask=None if mask is None else mask[..., :1, :1],
        scale=scale,
        return_pattern=return_pattern,
        return_lse=return_lse,
        backend=backend,
    )
    out = res.out.clone()
    out[:, 0] = torch.where(empty[None, :, None], first.out[:, 0].to(out.dtype), res.out[:, 0])
    lse, pattern, phantom, real = res.lse, res.pattern, res.phantom, res.lse_real
    if lse is not None and first.lse is not None:
        lse = lse.clone()
        lse[:, :, 0] = torch.where(empty[None], first.lse[:, :, 0], res.lse[:, :, 0])
    if real is not None:
        real = real.clone()
        real[:, :, 0] = torch.where(empty[None], first.lse_real[:, :, 0], res.lse_real[:, :, 0])
    if pattern is not None:
        pattern, phantom = pattern.clone(), phantom.clone()
        pattern[:, :, 0, 0] = torch.where(empty[None], first.pattern[:, :, 0, 0], res.pattern[:, :, 0, 0])
        phantom[:, :, 0] = torch.where(empty[None], first.phantom[:, :, 0], res.phantom[:, :, 0])
    return AttentionOutput(out, lse, pattern, phantom, real)


def depth_backend(value: torch.Tensor, backend: str | None = None) -> str:
    """The path a depth read of sources like ``value`` takes: "triton" (fused, CUDA) or "reference" (torch)."""
    backend = resolve_backend(backend)
    if backend == "auto":
        fused = value.device.type == "cuda" and triton_available() and value.dtype in _TRITON_DTYPES
        return "triton" if fused else "reference"
    return "triton" if backend == "triton" else "reference"


def depth_attention(
    values: Sequence[torch.Tensor],
    keys: Sequence[torch.Tensor],
    query: torch.Tensor,
    *,
    bias=None,
    normalize=True,
    eps=1e-6,
    return_weights=False,
    backend=None,
) -> DepthOutput:
    """Softmax read over S depth sources: h = Σ_i softmax_i(query . RMSNorm(k_i) + bias_i) values_i.

    values: S tensors (B,T,d); keys: S tensors (B,T,r) (views allowed, e.g. ``values[i][..., -r:]``); query (r,).
    No 1/sqrt(r) scaling. The Triton kernel reads the lists in place through pointer tables (no stacking).
    """
    values, keys = list(values), list(keys)
    check_sources(values, keys, query, bias)
    backend = depth_backend(values[0], backend)
    if backend != "triton":  # torch / sdpa / reference: the reference loop is the torch path
        return DepthOutput(
            *depth_attention_reference(
                values, keys, query, bias=bias, normalize=normalize, eps=eps, return_weights=return_weights
            )
        )
    _triton_on(values[0].device)
    from probe.kernels.depth_attention.triton import depth_attention_triton

    try:
        h, lse = depth_attention_triton(values, keys, query, bias=bias, normalize=normalize, eps=eps)
    except NoLaunchConfig as e:
        warn_fallback(e, "reference (torch loop over the sources)")
        return DepthOutput(
            *depth_attention_reference(
                values, keys, query, bias=bias, normalize=normalize, eps=eps, return_weights=return_weights
            )
        )
    weights = None
    if return_weights:  # cheap: r-wide scores in torch, normalised by the kernel's lse
        weights = torch.exp(depth_scores(keys, query, bias, normalize, eps) - lse[..., None])
    return DepthOutput(h, lse, weights)


def attention_row_masses(
    q, k, indicators, *, sink=None, key_bias=None, window=None, scale=None, softcap=None, lse=None, backend=None
):
    """(lse (B,H,T) fp32, masses (B,H,T,m) fp32) with masses[..., c] = Σ_j a_ij indicators[b, j, h // G, c].

    a includes the phantom in its normaliser: Σ_j a_ij = 1 - phantom_i, phantom_i = exp(sink_h - lse_i).
    softcap: Gemma 2's attention-logit soft-cap, scale q·k -> softcap tanh(scale q·k / softcap) before key_bias and
    the sink (None: none). The CPU flash op computes its scores itself and cannot cap, so a capped call takes the
    chunked path there. Nothing T x T is materialised except by backend='reference'.
    lse: the forward's real-key lse of these q, k (B,H,T), ``hook_lse`` (docs/definitions.md#row-log-normaliser);
    with it, columns that mark few keys or every key cost O(T) per row (row_masses_sparse) on any backend but
    'reference', instead of a recomputation of every score.
    """
    backend = resolve_backend(backend)
    _check_attention_args(q, k, indicators, sink, key_bias, window)
    if q.shape[1] != k.shape[1]:
        raise ValueError("attention_row_masses takes one sequence: as many queries as keys")
    if softcap is not None and not (isinstance(softcap, (int, float)) and 0 < softcap < math.inf):
        raise ValueError(f"softcap must be a positive finite number or None, got {softcap!r}")
    cap = None if softcap is None else float(softcap)
    window = None if window is None else int(window)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    kw = dict(sink=sink, key_bias=key_bias, scale=scale)
    if lse is not None and backend != "reference":
        if lse.shape != (q.shape[0], q.shape[2], q.shape[1]):
            raise ValueError(f"lse must be (B, H, T) = {(q.shape[0], q.shape[2], q.shape[1])}, got {tuple(lse.shape)}")
        found = row_masses_sparse(q, k, indicators, lse, window=window, softcap=cap, **kw)
        if found is not None:
            return found
    if backend == "auto" and auto_row_masses(q, window=window, softcap=cap) == "triton":
        backend = "triton"
    if backend == "reference":
        return row_masses_reference(q, k, indicators, window=window, softcap=cap, **kw)
    if backend == "triton":
        _triton_on(q.device)
        try:
            return row_masses_triton(q, k, indicators, window=window, softcap=cap, **kw)
        except NoLaunchConfig as e:
            warn_fallback(e, "chunked")
            return row_masses_chunked(q, k, indicators, window=window, softcap=cap, **kw)
    if q.device.type == "cpu" and window is None and cap is None and _cpu_flash is not None:
        return row_masses_flash_cpu(q, k, indicators, **kw)
    return row_masses_chunked(q, k, indicators, window=window, softcap=cap, **kw)
