"""Learning-rate schedules as a multiplier of the peak rate, indexed by optimizer step (0-based)."""

from __future__ import annotations

import math


def lr_factor(
    step: int, steps: int, warmup: int, schedule: str = "cosine", min_ratio: float = 0.1, warmdown: float = 0.2
) -> float:
    """Multiplier for the peak lr at optimizer step ``step`` of ``steps``.

    Both schedules warm up linearly over ``warmup`` steps (step 0 gets 1/warmup).
    ``cosine``: cosine decay from 1 to ``min_ratio``, reached at the final step (Wang 2026 appendix "Optimization").
    ``linear-warmdown``: constant 1, then a linear decay to ``min_ratio`` over the last ``warmdown`` fraction of the
    steps, reached at the final step (LR-AttnRes 2026 §4.1; pass ``min_ratio=0`` for a decay to zero).
    """
    if step < warmup:
        return (step + 1) / warmup
    last = steps - 1
    if schedule == "cosine":
        # the final step reaches min_ratio, also when warmup ends there (steps - 1)
        progress = 1.0 if step >= last else min(1.0, (step - warmup) / max(1, last - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    if schedule == "linear-warmdown":
        n_down = max(1, round(warmdown * steps))
        start = max(warmup, last - n_down)
        if step <= start:
            return 1.0
        return 1.0 - (1 - min_ratio) * min(1.0, (step - start) / max(1, last - start))
    raise ValueError(f"unknown schedule {schedule!r}: use 'cosine' or 'linear-warmdown'")
