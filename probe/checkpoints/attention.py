"""The attention function the HF adapters install (transformers ``AttentionInterface`` name ``"probe"``).

transformers 5 calls ``fn(module, query, key, value, attention_mask, scaling=..., dropout=..., sliding_window=...,
s_aux=...)`` after the projections and rotary, with q (B,H,Tq,dh), k/v (B,Hkv,Tk,dh) and the additive float mask that
``eager_mask`` builds (causal, sliding window and padding already in it). Here the §3 attention hooks fire:

    hook_q, hook_k, hook_v, hook_v_out, [hook_sink_logit], [hook_pattern, hook_phantom], hook_z

all with positions second (B,T,heads,dh). The phantom-key attention itself is the kernels' (probe.kernels, the same op
and reference the custom models use, with HF's additive mask in place of the causal rule): the pattern (fp32, the
learned sink as the phantom whose mass is 1 − row sum) is materialised only when a hook or cache asks for
``hook_pattern`` / ``hook_phantom``, the caller passed ``output_attentions=True``, dropout is active, or the
adapter is materialising (``probe.materialize(model)`` / ``materialize_patterns``); otherwise the fused op computes the
same output on the runtime backend. An attention module that no adapter hooked runs the same math without hooks.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask

from probe.kernels import sink_attention
from probe.kernels.sink_attention.reference import attention_probs

try:  # where transformers collects attentions for output_attentions=True (an internal: absent in other versions)
    from transformers.utils.output_capturing import _active_collector
except ImportError:  # pragma: no cover
    _active_collector = None

ATTN_IMPLEMENTATION = "probe"

# key in an HF attention module's __dict__ holding the adapter's hook container for that layer (hooked_hf._AttnHooks);
# a plain attribute, not a submodule, so state dicts are unchanged and deep copies stay consistent
SITE_KEY = "_probe_attn"


def _bthd(x):  # (B,H,T,dh) <-> (B,T,H,dh)
    return x.transpose(1, 2)


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
    """fp32 attention probabilities over real keys and the phantom (sink) mass: the kernels' reference.

    q (B,H,Tq,dh), k (B,H,Tk,dh) already repeated to H heads, mask additive (broadcastable to B,H,Tq,Tk) or None
    (causal), sinks (H,) logits or None. Returns pattern (B,H,Tq,Tk) and phantom (B,H,Tq); rows sum to 1 - phantom.
    """
    pattern, phantom, _ = attention_probs(_bthd(q), _bthd(k), sink=sinks, mask=mask, scale=scaling)
    return pattern, phantom


def fast_attention(q, k, v, mask, scaling: float, sinks=None):
    """Output (B,H,Tq,dh) without materialising the pattern: the kernels' fused op (SDPA with the sink as an extra
    key of value 0 on CPU), GQA without repetition; q (B,H,Tq,dh), k/v (B,Hkv,Tk,dh)."""
    return _bthd(sink_attention(_bthd(q), _bthd(k), _bthd(v), sink=sinks, mask=mask, scale=scaling).out)


def _hf_wants_attentions() -> bool:
    """True inside a transformers forward called with ``output_attentions=True``."""
    collected = None if _active_collector is None else _active_collector.get()
    return isinstance(collected, dict) and "attentions" in collected


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
    training = module.training and dropout > 0
    need_pattern = need_pattern or training or _hf_wants_attentions()  # dropout acts on the probabilities
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
        out = fast_attention(query, key, value, mask, scaling, sinks)
    out = _bthd(out)
    if site is not None:
        out = site.hook_z(out)
    return out.contiguous(), weights


_registered = False


def register() -> str:
    """Register ``"probe"`` with transformers' attention and mask interfaces (idempotent); returns the name."""
    global _registered
    if not _registered:
        AttentionInterface.register(ATTN_IMPLEMENTATION, probe_attention)
        AttentionMaskInterface.register(ATTN_IMPLEMENTATION, eager_mask)
        _registered = True
    return ATTN_IMPLEMENTATION
