"""Shared checks of HF adapters against HF eager (tests/checkpoints/test_adapters.py,
tests/checkpoints/test_adapters_families.py)."""

from __future__ import annotations

import torch


def check_logits_match_hf_eager(m, ref, x, atol: float, exact: float) -> dict:
    """The adapter's fast path within ``atol`` of HF eager, its every-hook path within ``exact``; returns the cache."""
    want = ref(x).logits
    assert want.abs().max() > 0.05  # the random model is not degenerate
    torch.testing.assert_close(m(x).logits, want, atol=atol, rtol=0)  # fast path (SDPA; soft-capped: eager)
    out, cache = m.run_with_cache(x)  # every hook: pattern path
    torch.testing.assert_close(out, want, atol=exact, rtol=0)
    return cache
