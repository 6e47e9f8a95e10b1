"""Row masses on Triton: the sink-attention forward kernel with the indicators as fp32 values (imports triton)."""

from __future__ import annotations

import torch

from probe.kernels.sink_attention.triton import attention_configs, sink_attention_forward


def row_masses_triton(q, k, indicators, *, sink=None, key_bias=None, window=None, scale, softcap=None):
    """(lse (B,H,T), masses (B,H,T,m)) fp32; NoLaunchConfig when the forward does not fit the device
    (probe.kernels.launch)."""
    ind = indicators.float()  # p @ indicators in fp32 (exact dot), whatever q's dtype
    config = attention_configs(q, ind, backward=False)["sink_forward"]
    sink = None if sink is None else sink.float().contiguous()
    key_bias = None if key_bias is None else key_bias.float().contiguous()
    out, lse = sink_attention_forward(
        q, k.to(q.dtype), ind, sink, key_bias, window, scale, out_dtype=torch.float32, softcap=softcap, config=config
    )
    return lse, out.transpose(1, 2)
