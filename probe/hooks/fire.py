"""Firing a hook point and telling whether a hook edited what it saw.

A TransformerLens hook may return a new tensor, or write into the activation it was given and return it (or None):
``x[:, pos] = patch; return x`` is the usual patching style. Code that fires a point on a tensor it derived for the
hook (scores read back from a pattern, the heads' writes, the streams' sum) and then carries on from its own copy
must therefore check both: ``fired is not x`` misses every in-place edit, and the edit would be silently dropped.
"""

from __future__ import annotations

import torch
from transformer_lens.hook_points import HookPoint


def version(t: torch.Tensor) -> int | None:
    """The tensor's in-place version counter, or None for an inference-mode tensor (which counts none)."""
    try:
        return t._version
    except RuntimeError:  # inference mode: only a replaced tensor shows an edit there
        return None


def fire(point: HookPoint, t: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """(point(t), whether a hook edited it): replaced it, or changed it in place."""
    before = version(t)
    out = point(t)
    return out, out is not t or (before is not None and version(t) != before)
