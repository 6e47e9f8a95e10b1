"""``attention_row_masses``: picks the sparse read, the CPU flash op, the chunked loop, the reference or Triton.

    backend    path
    auto       CUDA + triton -> triton; CPU, no window, no soft-cap -> flash; else chunked
    torch      CPU flash, or chunked (a window, a soft-cap, another device)
    sdpa       as torch
    reference  reference.py: T x T, fp32
    triton     triton.py: CUDA tensors, or CPU tensors under TRITON_INTERPRET=1 (set before importing triton)

Given the forward's real-key lse, every backend but 'reference' first tries sparse.py (columns that mark few keys or
every key). When no launch setting of the Triton kernel fits the device's shared memory (probe.kernels.launch), the
call runs chunked instead (never the T x T reference), with one warning per shape. Chunked attention (``chunk``:
Llama 4's) is a different thing: each chunk of positions runs as a sequence of its own, on the path chosen above.
"""

from __future__ import annotations

import math

import torch

from probe.kernels.backend import TRITON_DTYPES, check_triton, resolve_backend, triton_available
from probe.kernels.common import check_attention_args, cpu_flash
from probe.kernels.launch import NoLaunchConfig, warn_fallback
from probe.kernels.row_masses.chunked import row_masses_chunked
from probe.kernels.row_masses.flash import row_masses_flash_cpu
from probe.kernels.row_masses.reference import row_masses_reference
from probe.kernels.row_masses.sparse import row_masses_sparse


def auto_row_masses(q, *, window=None, softcap=None) -> str:
    """The path backend="auto" takes for attention_row_masses on q: "triton", "flash" (CPU) or "chunked"."""
    if q.device.type == "cuda" and triton_available() and q.dtype in TRITON_DTYPES:
        return "triton"
    if q.device.type == "cpu" and window is None and softcap is None and cpu_flash is not None:
        return "flash"
    return "chunked"


def attention_row_masses(
    q,
    k,
    indicators,
    *,
    sink=None,
    key_bias=None,
    window=None,
    chunk=None,
    scale=None,
    softcap=None,
    lse=None,
    backend=None,
):
    """(lse (B,H,T) fp32, masses (B,H,T,m) fp32) with masses[..., c] = Σ_j a_ij indicators[b, j, h // G, c].

    a includes the phantom in its normaliser: Σ_j a_ij = 1 - phantom_i, phantom_i = exp(sink_h - lse_i).
    softcap: Gemma 2's attention-logit soft-cap, scale q·k -> softcap tanh(scale q·k / softcap) before key_bias and
    the sink (None: none). The CPU flash op computes its scores itself and cannot cap, so a capped call takes the
    chunked path there. Nothing T x T is materialised except by backend='reference'.
    lse: the forward's real-key lse of these q, k (B,H,T), ``hook_lse`` (docs/definitions.md#row-log-normaliser);
    with it, columns that mark few keys or every key cost O(T) per row (row_masses_sparse) on any backend but
    'reference', instead of a recomputation of every score.
    chunk: chunked attention (Llama 4's attention_chunk_size): query t sees the causal keys of its own chunk of
    ``chunk`` positions only (positions counted from 0), so each chunk is a sequence of its own.
    """
    if chunk is not None:
        kw = dict(sink=sink, window=window, scale=scale, softcap=softcap, backend=backend)
        return _per_chunk(q, k, indicators, int(chunk), key_bias=key_bias, lse=lse, **kw)
    backend = resolve_backend(backend)
    check_attention_args(q, k, indicators, sink, key_bias, window)
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
        check_triton(q.device)
        from probe.kernels.row_masses.triton import row_masses_triton

        try:
            return row_masses_triton(q, k, indicators, window=window, softcap=cap, **kw)
        except NoLaunchConfig as e:
            warn_fallback(e, "chunked")
            return row_masses_chunked(q, k, indicators, window=window, softcap=cap, **kw)
    if q.device.type == "cpu" and window is None and cap is None and cpu_flash is not None:
        return row_masses_flash_cpu(q, k, indicators, **kw)
    return row_masses_chunked(q, k, indicators, window=window, softcap=cap, **kw)


def _per_chunk(q, k, indicators, chunk: int, *, key_bias=None, lse=None, **kw):
    """attention_row_masses of chunked attention: one call per chunk of ``chunk`` positions, its key bias and lse
    sliced with it, the results joined along T."""
    if chunk < 1:
        raise ValueError(f"chunk must be a positive int or None, got {chunk!r}")
    parts = [
        attention_row_masses(
            q[:, a : a + chunk],
            k[:, a : a + chunk],
            indicators[:, a : a + chunk],
            key_bias=None if key_bias is None else key_bias[..., a : a + chunk],
            lse=None if lse is None else lse[..., a : a + chunk],
            **kw,
        )
        for a in range(0, q.shape[1], chunk)
    ]
    return torch.cat([p[0] for p in parts], dim=-1), torch.cat([p[1] for p in parts], dim=-2)
