"""softpick's per-tile math for the shared row-rule kernels (probe.kernels.rule_triton), online over key tiles as
flash softmax is (docs/definitions.md#softpick; Zuhri et al.'s ``flash_softpick_attn.py`` does the same, with the row
max itself as the shift and eps 1e-6; probe keeps the reference's max(0, row max) and eps).

    forward   the shift m starts at 0 (the reference's max(0, max_j s_j)) and grows tile by tile; since
              e_j = exp(s_j - m) - exp(-m) = exp(-m) (exp(s_j) - 1), a new shift m' rescales every e_j seen so far by
              exp(m - m'), so both sum_j |e_j| and sum_j relu(e_j) v_j carry across tiles with that one factor, and
              the sign of e_j is the sign of s_j whatever the shift. The key that sets m (the first, as torch.max's
              index) is kept for the gradient through m.
    backward  with L = m + log D (D = sum_j |e_j| + eps), a_j = relu(exp(s_j - L) - exp(-L)) and, c = dO . O,
              dL/ds_j = exp(s_j - L) (dp_j [s_j > 0] - c sign(s_j)) on visible keys, and on the key that set m > 0
              also -c eps / D (softpick/fused.py's gradient through the shift; Zuhri et al.'s kernel leaves it out).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def softpick_step(s, m, arg, start_n):
    """One key tile of the online forward: s (M, N) scores (-inf hidden), m (M,) the shift so far (>= 0), arg (M,)
    its key (-1: no key above 0 yet) -> (e (M, N), 0 on hidden keys; the new m and arg; alpha (M,), the rescale of
    what earlier tiles carried)."""
    top = tl.max(s, 1)
    top_col = tl.argmax(s, 1) + start_n
    arg = tl.where(top > m, top_col, arg)
    m_new = tl.maximum(m, top)
    alpha = tl.exp(m - m_new)
    e = tl.exp(s - m_new[:, None]) - tl.exp(-m_new)[:, None]
    e = tl.where(s == float("-inf"), 0.0, e)
    return e, m_new, arg, alpha


@triton.jit
def softpick_grads(s, dp, lse, delta, pick, arg, cols):
    """(a, ds): the weights (M, N) and dL/ds (M, N) of a tile, from the row's L = m + log D (``lse``), c = dO . O
    (``delta``), eps / D where a key set m > 0 (``pick``, else 0) and that key (``arg``)."""
    p = tl.exp(s - lse[:, None])  # exp(s - m) / D; 0 on hidden keys
    a = tl.maximum(p - tl.exp(-lse)[:, None], 0.0)
    sign = tl.where(s > 0.0, 1.0, tl.where(s < 0.0, -1.0, 0.0))
    ds = p * (tl.where(s > 0.0, dp, 0.0) - delta[:, None] * sign)
    ds -= tl.where(cols[None, :] == arg[:, None], (delta * pick)[:, None], 0.0)
    return a, ds
