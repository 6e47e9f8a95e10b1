"""The attention function the HF adapters install (transformers ``AttentionInterface`` name ``"probe"``).

transformers 5 calls ``fn(module, query, key, value, attention_mask, scaling=..., dropout=..., sliding_window=...,
s_aux=...)`` after the projections and rotary, with q (B,H,Tq,dh), k/v (B,Hkv,Tk,dh) and the additive float mask that
``eager_mask`` builds (causal, sliding window and padding already in it). Here the §3 attention hooks fire:

    hook_q, hook_k, hook_v, hook_v_out, [hook_sink_logit], [hook_pattern, hook_phantom], hook_z

all with positions second (B,T,heads,dh). The pattern is materialised (fp32 softmax, GQA by repetition, the learned sink
as an extra logit column whose probability is the phantom mass) only when a hook or cache asks for ``hook_pattern`` /
``hook_phantom``, the caller passed ``output_attentions=True`` or the adapter's ``materialize_patterns`` is on;
otherwise one SDPA call computes the same output.
An attention module that no adapter hooked runs the same math without hooks.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

ATTN_IMPLEMENTATION = "probe"

# key in an HF attention module's __dict__ holding the adapter's hook container for that layer (hooked_hf._AttnHooks);
# a plain attribute, not a submodule, so state dicts are unchanged and deep copies stay consistent
SITE_KEY = "_probe_attn"


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(B,Hkv,T,dh) -> (B,Hkv*n_rep,T,dh), query head h reading KV head h // n_rep (HF's GQA layout)."""
    if n_rep == 1:
        return x
    b, hkv, t, dh = x.shape
    return x[:, :, None].expand(b, hkv, n_rep, t, dh).reshape(b, hkv * n_rep, t, dh)


def _float_mask(attention_mask, q_len: int, k_len: int, device) -> torch.Tensor | None:
    """The additive fp32 mask (B|1, 1, Tq, Tk); a missing mask means causal with the queries last."""
    if attention_mask is None:
        if q_len == 1:
            return None
        allowed = torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril(k_len - q_len)
        return torch.zeros(q_len, k_len, device=device).masked_fill(~allowed, float("-inf"))[None, None]
    if attention_mask.dtype == torch.bool:
        return torch.zeros(attention_mask.shape, device=device).masked_fill(~attention_mask, float("-inf"))
    return attention_mask[..., :k_len].float()


def eager_probs(q, k, mask, scaling: float, sinks=None):
    """fp32 attention probabilities over real keys and the phantom (sink) mass.

    q (B,H,Tq,dh), k (B,H,Tk,dh) already repeated to H heads, mask additive (broadcastable to B,H,Tq,Tk) or None,
    sinks (H,) logits or None. Returns pattern (B,H,Tq,Tk) and phantom (B,H,Tq); pattern rows sum to 1 - phantom.
    """
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scaling
    if mask is not None:
        scores = scores + mask
    if sinks is None:
        pattern = torch.softmax(scores, dim=-1)
        return pattern, pattern.new_zeros(pattern.shape[:-1])
    b, h, tq, _ = scores.shape
    sink_col = sinks.float().reshape(1, h, 1, 1).expand(b, h, tq, 1)
    probs = torch.softmax(torch.cat([scores, sink_col], dim=-1), dim=-1)
    return probs[..., :-1], probs[..., -1]


def fast_attention(q, k, v, mask, scaling: float, sinks=None, dropout: float = 0.0):
    """Output (B,H,Tq,dh) without materialising the pattern: one SDPA call.

    A sink becomes one extra key whose logit is the sink for every query: q gains a constant 1 coordinate, the extra
    key is (0, …, 0, sink_h / scale) and its value is 0, so the softmax normaliser gains exp(sink_h) exactly as in the
    eager formula.
    """
    h, hkv = q.shape[1], k.shape[1]
    if sinks is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=None if mask is None else mask.to(q.dtype),
                                              dropout_p=dropout, scale=scaling, enable_gqa=h != hkv)
    k, v = repeat_kv(k, h // hkv), repeat_kv(v, h // hkv)
    b, _, tq, dh = q.shape
    tk = k.shape[2]
    q2 = torch.cat([q, q.new_ones(b, h, tq, 1)], dim=-1)
    sink_coord = (sinks.to(k.dtype) / scaling).reshape(1, h, 1, 1).expand(b, h, 1, 1)
    sink_key = torch.cat([k.new_zeros(b, h, 1, dh), sink_coord], dim=-1)
    k2 = torch.cat([torch.cat([k, k.new_zeros(b, h, tk, 1)], dim=-1), sink_key], dim=2)
    v2 = torch.cat([v, v.new_zeros(b, h, 1, dh)], dim=2)
    if mask is None:
        mask = torch.zeros(1, 1, tq, tk, device=q.device)
    mask2 = torch.cat([mask.expand(mask.shape[0], 1, tq, tk), mask.new_zeros(mask.shape[0], 1, tq, 1)], dim=-1)
    return F.scaled_dot_product_attention(q2, k2, v2, attn_mask=mask2.to(q.dtype), dropout_p=dropout, scale=scaling)


def _hf_wants_attentions() -> bool:
    """True inside a transformers forward called with ``output_attentions=True``."""
    try:
        from transformers.utils.output_capturing import _active_collector

        collected = _active_collector.get()
    except Exception:  # pragma: no cover - transformers internals moved
        return False
    return isinstance(collected, dict) and "attentions" in collected


def _bthd(x):  # (B,H,T,dh) -> (B,T,H,dh)
    return x.transpose(1, 2)


def probe_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, sliding_window=None,
                    s_aux=None, **kwargs):
    """transformers attention function: fires the §3 hooks of the layer that owns ``module``."""
    site = module.__dict__.get(SITE_KEY)
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    sinks = s_aux
    if site is not None:
        query = _bthd(site.hook_q(_bthd(query)))
        key = _bthd(site.hook_k(_bthd(key)))
        value = _bthd(site.hook_v(_bthd(value)))
        value = _bthd(site.hook_v_out(_bthd(value)))
        if sinks is not None and hasattr(site, "hook_sink_logit"):
            sinks = site.hook_sink_logit(sinks)
        need_pattern = site.materialize or site.hook_pattern.has_hooks() or site.hook_phantom.has_hooks()
    else:
        need_pattern = False
    need_pattern = need_pattern or _hf_wants_attentions()
    training = module.training and dropout > 0
    n_rep = query.shape[1] // key.shape[1]
    mask = _float_mask(attention_mask, query.shape[2], key.shape[2], query.device)

    weights = None
    if need_pattern:
        pattern, phantom = eager_probs(query, repeat_kv(key, n_rep), mask, scaling, sinks)
        if site is not None:
            pattern = site.hook_pattern(pattern)
            phantom = site.hook_phantom(phantom)
        weights = pattern.to(query.dtype)
        probs = F.dropout(weights, p=dropout, training=True) if training else weights
        out = torch.matmul(probs, repeat_kv(value, n_rep))
    else:
        out = fast_attention(query, key, value, mask, scaling, sinks, dropout if training else 0.0)
    out = _bthd(out)
    if site is not None:
        out = site.hook_z(out)
    return out.contiguous(), weights


_registered = False


def register() -> str:
    """Register ``"probe"`` with transformers' attention and mask interfaces (idempotent); returns the name."""
    global _registered
    if not _registered:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, eager_mask

        AttentionInterface.register(ATTN_IMPLEMENTATION, probe_attention)
        AttentionMaskInterface.register(ATTN_IMPLEMENTATION, eager_mask)
        _registered = True
    return ATTN_IMPLEMENTATION
