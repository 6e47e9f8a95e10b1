"""The T x T fp32 reference of the row masses: sink attention's reference with the indicators as the values."""

from __future__ import annotations

from probe.kernels.sink_attention.reference import sink_attention_reference


def row_masses_reference(q, k, indicators, *, sink=None, key_bias=None, window=None, scale=None, softcap=None):
    """q (B,T,H,dh), k (B,T,Hkv,dh), indicators (B,T,Hkv,m) -> (lse (B,H,T), masses (B,H,T,m)), fp32 (fp64 inputs:
    fp64)."""
    out, lse, _, _ = sink_attention_reference(
        q.float(),
        k.float(),
        indicators.float(),
        sink=None if sink is None else sink.float(),  # fp32 throughout, whatever the inputs' dtype
        key_bias=None if key_bias is None else key_bias.float(),
        window=window,
        scale=scale,
        softcap=softcap,
    )
    return lse, out.transpose(1, 2)  # (B, H, T), (B, H, T, m)
