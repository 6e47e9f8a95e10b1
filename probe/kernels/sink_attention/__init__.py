"""Sink attention: reference.py (fp32, materialises the pattern), sdpa.py (fused torch path), triton.py (CUDA kernel,
imported lazily), edits.py (attention edits the op carries out), dispatch.py (``probe.kernels.sink_attention``, which
picks among them)."""
