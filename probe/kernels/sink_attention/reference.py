"""Readable fp32 reference for causal attention with a phantom sink key, value transforms and per-key logit biases.

    s_ij  = scale * q_i . k_j + key_bias_j (+ log g_j for routing-norm)     for visible j (i - window < j <= i)
    lse_i = log(exp(sink_h) + sum_j exp(s_ij))
    a_ij  = exp(s_ij - lse_i)          phantom_i = exp(sink_h - lse_i)      sum_j a_ij + phantom_i = 1
    out_i = sum_j a_ij v'_j            (the phantom's value is 0)

Materialises the (B, H, T, T) pattern: this is what tests compare against and what hooked forwards use.
"""
from __future__ import annotations

import math

import torch

from probe.kernels.value_transform import apply_transform


def visible_mask(T: int, window: int | None, device=None) -> torch.Tensor:
    """(T, T) bool, True where key j is visible to query i: i - window < j <= i (window=None: j <= i)."""
    i = torch.arange(T, device=device)[:, None]
    j = torch.arange(T, device=device)[None, :]
    mask = j <= i
    if window is not None:
        mask &= j > i - window
    return mask


def sink_attention_reference(q, k, v, *, sink=None, transform="identity", tau=None, w=None, b=None, beta=8.0,
                             key_bias=None, window=None, scale=None, return_pattern=False):
    """q (B,T,H,dh), k (B,T,Hkv,dh), v (B,T,Hkv,dv) -> (out (B,T,H,dv) q.dtype, lse (B,H,T), pattern, phantom)."""
    B, T, H, dh = q.shape
    Hkv = k.shape[2]
    G = H // Hkv  # query heads per kv head; head h reads kv head h // G
    scale = 1.0 / math.sqrt(dh) if scale is None else scale
    v, key_bias = apply_transform(v, transform, key_bias, tau=tau, w=w, b=b, beta=beta)

    qf = q.float().transpose(1, 2)  # (B, H, T, dh)
    kf = k.float().transpose(1, 2).repeat_interleave(G, dim=1)  # (B, H, T, dh)
    vf = v.float().transpose(1, 2).repeat_interleave(G, dim=1)  # (B, H, T, dv)
    scores = scale * (qf @ kf.transpose(-1, -2))  # (B, H, T, T)
    if key_bias is not None:
        scores = scores + key_bias.repeat_interleave(G, dim=1)[:, :, None, :]  # (B, H, 1, T) over keys
    scores = scores.masked_fill(~visible_mask(T, window, q.device), float("-inf"))

    lse = scores.logsumexp(-1)  # (B, H, T)
    if sink is not None:
        sink_f = sink.float()[None, :, None].expand(B, H, T)  # (B, H, T)
        lse = torch.logaddexp(lse, sink_f)
    pattern = torch.exp(scores - lse[..., None])  # (B, H, T, T), rows sum to 1 - phantom
    out = (pattern @ vf).transpose(1, 2).to(q.dtype)  # (B, T, H, dv)
    if not return_pattern:
        return out, lse, None, None
    phantom = torch.exp(sink_f - lse) if sink is not None else torch.zeros_like(lse)  # (B, H, T)
    return out, lse, pattern, phantom
