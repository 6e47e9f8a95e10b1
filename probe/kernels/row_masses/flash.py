"""Row masses on torch's fused CPU flash op (``_scaled_dot_product_flash_attention_for_cpu``).

The op takes (B,H,T,D) q/k/v with one shared head size and returns (out, lse (B,H,T)): the indicators ride as the
values, key_bias as one extra q/k coordinate, and the sink is folded in afterwards (``fold_sink``):
lse' = logaddexp(lse, sink), out' = out exp(lse - lse'). Causal only, no window, no soft-cap.
"""

from __future__ import annotations

import torch

from probe.kernels.common import cpu_flash, pad_last


def fold_sink(lse, masses, sink):
    """(lse, masses) over the real keys -> the same with the phantom in the normaliser (sink None: unchanged)."""
    if sink is None:
        return lse, masses
    lse_s = torch.logaddexp(lse, sink.float()[None, :, None])  # (B, H, T)
    return lse_s, masses * torch.exp(lse - lse_s)[..., None]


def row_masses_flash_cpu(q, k, indicators, *, sink=None, key_bias=None, scale):
    """Causal, no window, no soft-cap, CPU tensors."""
    B, T, H, dh = q.shape
    m = indicators.shape[-1]
    qt, kt, vt = q.float().transpose(1, 2), k.float().transpose(1, 2), indicators.float().transpose(1, 2)
    if key_bias is not None:  # q gets 1/scale, k gets key_bias: the logit gains key_bias exactly
        qt = torch.cat([qt, qt.new_full((B, H, T, 1), 1.0 / scale)], -1)
        kt = torch.cat([kt, key_bias.float()[..., None]], -1)
    D = -(-max(qt.shape[-1], m) // 8) * 8
    out, lse = cpu_flash(pad_last(qt, D), pad_last(kt, D), pad_last(vt, D), 0.0, True, scale=scale)
    return fold_sink(lse.float(), out[..., :m], sink)
