"""Readable fp32 reference for attention over depth (AttnRes / LR-AttnRes read sites, LR-AttnRes 2026 Eq. 2-3, 8-10).

    k̄_i   = k_i * rsqrt(mean(k_i^2) + eps)          RMSNorm without a learned gain (when normalize)
    s_i   = query . k̄_i + bias_i                    no 1/sqrt(r) scaling
    α_i   = softmax_i(s_i)      lse = logsumexp_i(s_i)
    h     = Σ_i α_i values_i

Sources are taken as lists (never stacked for the values); only the r-wide keys are scored one by one.
"""

from __future__ import annotations

import torch

from probe.kernels.common import wide


def rms_normalize(k: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm without gain over the last dim, in fp32 (or fp64 for fp64 keys)."""
    k = wide(k)
    return k * torch.rsqrt(k.pow(2).mean(-1, keepdim=True) + eps)


def check_sources(values, keys, query, bias=None) -> None:
    if len(values) == 0 or len(values) != len(keys):
        raise ValueError(f"need S >= 1 values and as many keys, got {len(values)} values and {len(keys)} keys")
    shape, r = values[0].shape[:-1], query.shape[-1]
    for v, k in zip(values, keys):
        if v.shape != values[0].shape or k.shape[:-1] != shape or k.shape[-1] != r:
            raise ValueError(
                f"sources must be (B,T,d) values and (B,T,{r}) keys, got {tuple(v.shape)}, {tuple(k.shape)}"
            )
    if bias is not None and bias.shape != (len(values),):
        raise ValueError(f"bias must have shape ({len(values)},), got {tuple(bias.shape)}")


def depth_scores(keys, query, bias=None, normalize=True, eps=1e-6) -> torch.Tensor:
    """(B, T, S) fp32 logits of the S sources."""
    qf = wide(query)  # (r,)
    scores = torch.stack(
        [(rms_normalize(k, eps) if normalize else wide(k)) @ qf.to(wide(k).dtype) for k in keys], -1
    )  # (B, T, S)
    return scores if bias is None else scores + wide(bias)


def depth_attention_reference(values, keys, query, *, bias=None, normalize=True, eps=1e-6, return_weights=False):
    """values: S x (B,T,d), keys: S x (B,T,r), query (r,) -> (h (B,T,d) in values' dtype, lse (B,T), weights or
    None)."""
    check_sources(values, keys, query, bias)
    scores = depth_scores(keys, query, bias, normalize, eps)  # (B, T, S)
    lse = scores.logsumexp(-1)  # (B, T)
    alpha = torch.exp(scores - lse[..., None])  # (B, T, S)
    h = alpha[..., 0, None] * wide(values[0])
    for i in range(1, len(values)):
        h = torch.addcmul(h, alpha[..., i, None], wide(values[i]))  # h += α_i v_i in one fused op
    return h.to(values[0].dtype), lse, alpha if return_weights else None


def merge_depth(h_a, lse_a, h_b, lse_b):
    """Online-softmax merge of two partial depth reads over disjoint source sets (block AttnRes two-phase inference).

    h_* (B,T,d), lse_* (B,T) -> (h, lse) exactly as if both source sets had been read in one call. Associative.
    A partial with lse = -inf (no sources) contributes nothing.
    """
    lse = torch.logaddexp(lse_a.float(), lse_b.float())  # (B, T)
    safe = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    wa = torch.exp(lse_a.float() - safe)[..., None]  # (B, T, 1)
    wb = torch.exp(lse_b.float() - safe)[..., None]
    return (wa * h_a.float() + wb * h_b.float()).to(h_a.dtype), lse
