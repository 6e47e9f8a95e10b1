"""Depth attention: reference.py (fp32 loop over the source list, merge_depth), triton.py (CUDA kernel reading the
sources through pointer tables, imported lazily) and dispatch.py (``probe.kernels.depth_attention``, which picks
between them)."""
