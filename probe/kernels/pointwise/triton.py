"""The pointwise rules' per-tile math for the shared row-rule kernels (probe.kernels.rule_triton): each key's weight
from its own score, so a tile needs nothing from the rest of the row; the normalised forms divide by the row's sum
D = sum_j w_j + eps, which the forward carries across key tiles as softmax carries its l (no running max: both kernels
are bounded by 1 + x and never overflow where softmax's exp would).

    w   = f(x), x = s + b       sigmoid(x), or elu(x) + 1 (exp(x) for x <= 0, 1 + x above); 0 at x = -inf (hidden)
    f'  from w (and x)          sigmoid: w (1 - w); elu + 1: 1 where x > 0, else w
"""

from __future__ import annotations

import triton
import triton.language as tl

SIGMOID, ELU1 = 0, 1  # the KERNEL constexpr (probe.kernels.rule_triton.RULE_IDS)


@triton.jit
def pointwise_weights(x, KERNEL: tl.constexpr):
    """f(x) elementwise; -inf (a hidden key) -> 0."""
    if KERNEL == 0:
        w = tl.sigmoid(x)
    else:
        w = tl.where(x > 0.0, x + 1.0, tl.exp(tl.minimum(x, 0.0)))  # exp only where it is the value: no overflow
    return w


@triton.jit
def pointwise_slope(x, w, KERNEL: tl.constexpr):
    """f'(x) from x and its weight w = f(x); 0 on hidden keys (w = 0)."""
    if KERNEL == 0:
        slope = w * (1.0 - w)
    else:
        slope = tl.where(x > 0.0, 1.0, w)
    return slope
