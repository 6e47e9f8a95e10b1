"""Depth attention: reference.py (fp32 loop over the source list, merge_depth) and triton.py (CUDA kernel reading the
sources through pointer tables, imported lazily). Use probe.kernels.depth_attention() to dispatch."""

from probe.kernels.depth_attention.reference import depth_attention_reference, merge_depth, rms_normalize

__all__ = ["depth_attention_reference", "merge_depth", "rms_normalize"]
