"""``depth_attention``: picks the reference loop over the sources or the Triton kernel.

    backend                     path
    auto                        CUDA + triton -> triton; else reference
    torch / sdpa / reference    reference.py: a loop over the source list (there is no SDPA form)
    triton                      triton.py: CUDA tensors, or CPU tensors under TRITON_INTERPRET=1 (set before importing
                                triton)

When no launch setting of the Triton kernels fits the device's shared memory (probe.kernels.launch), the call runs the
reference loop instead, with one warning per shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from probe.kernels.backend import TRITON_DTYPES, check_triton, resolve_backend, triton_available
from probe.kernels.depth_attention.reference import check_sources, depth_attention_reference, depth_scores
from probe.kernels.launch import NoLaunchConfig, warn_fallback


class DepthOutput(NamedTuple):
    h: torch.Tensor  # (B, T, d) in values' dtype
    lse: torch.Tensor  # (B, T) fp32
    weights: torch.Tensor | None  # (B, T, S) fp32 (return_weights)


def depth_backend(value: torch.Tensor, backend: str | None = None) -> str:
    """The path a depth read of sources like ``value`` takes: "triton" (fused, CUDA) or "reference" (torch)."""
    backend = resolve_backend(backend)
    if backend == "auto":
        fused = value.device.type == "cuda" and triton_available() and value.dtype in TRITON_DTYPES
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
    kw = dict(bias=bias, normalize=normalize, eps=eps)
    if depth_backend(values[0], backend) != "triton":
        return DepthOutput(*depth_attention_reference(values, keys, query, return_weights=return_weights, **kw))
    check_triton(values[0].device)
    from probe.kernels.depth_attention.triton import depth_attention_triton

    try:
        h, lse = depth_attention_triton(values, keys, query, **kw)
    except NoLaunchConfig as e:
        warn_fallback(e, "reference (torch loop over the sources)")
        return DepthOutput(*depth_attention_reference(values, keys, query, return_weights=return_weights, **kw))
    weights = None
    if return_weights:  # cheap: r-wide scores in torch, normalised by the kernel's lse
        weights = torch.exp(depth_scores(keys, query, bias, normalize, eps) - lse[..., None])
    return DepthOutput(h, lse, weights)
