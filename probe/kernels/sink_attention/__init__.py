"""Sink attention: reference.py (fp32, materialises the pattern), sdpa.py (fused CPU path), triton.py (CUDA kernel,
imported lazily), row_masses.py (per-row masses without T x T memory). Use probe.kernels.sink_attention() to
dispatch."""

from probe.kernels.sink_attention.reference import sink_attention_reference, visible_mask
from probe.kernels.sink_attention.sdpa import sink_attention_sdpa

__all__ = ["sink_attention_reference", "sink_attention_sdpa", "visible_mask"]
