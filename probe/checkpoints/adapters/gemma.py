"""Gemma 2 / Gemma 3 adapter: sandwich norms, sliding/full layers, QK-norm (Gemma 3), attention-logit soft-capping
(Gemma 2), GQA, no sink.

Layer (HF's order): resid_pre → input_layernorm → self_attn → post_attention_layernorm → resid_mid = resid_pre + that
→ pre_feedforward_layernorm → mlp → post_feedforward_layernorm → resid_post = resid_mid + that. ``hook_embed`` is the
embedding already scaled by √d (Gemma's embedding module scales it). hook_q/hook_k are after QK-norm and rotary (local
and global rotary bases per layer type), as HF passes them to the attention function.

Attention scores are ``q·k · query_pre_attn_scalar^-½`` (not ``d_head^-½``), recorded as ``extra["attn_scale"]``.
Gemma 2 soft-caps them, ``cap · tanh(scores / cap)``, before the mask; :func:`softcap_attention` fires the same hooks
as probe's shared attention function with that cap inside ``hook_pattern``, exactly as HF eager does. The final-logit
soft-cap stays in HF's LM head.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from probe.checkpoints import attention as _attn
from probe.checkpoints.hooked_hf import HookedHF, base_info

SOFTCAP_IMPLEMENTATION = "probe_softcap"


def sandwich_layer_forward(layer, hooks, hidden_states, **kwargs):
    """Gemma's decoder layer: each sub-layer output is normed again before it joins the residual stream."""
    hidden_states = hooks.hook_resid_pre(hidden_states)
    attn_out, _ = layer.self_attn(hidden_states=layer.input_layernorm(hidden_states), **kwargs)
    mid = hooks.hook_resid_mid(hidden_states + layer.post_attention_layernorm(attn_out))
    mlp_out = layer.post_feedforward_layernorm(layer.mlp(layer.pre_feedforward_layernorm(mid)))
    return hooks.hook_resid_post(mid + mlp_out)


def _bthd(x):  # (B,H,T,dh) <-> (B,T,H,dh)
    return x.transpose(1, 2)


def softcap_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, softcap=None, **kwargs):
    """probe's attention function with Gemma 2's attention-logit soft-cap; without a cap it is probe_attention.

    SDPA cannot soft-cap, so with a cap the pattern is always materialised (as HF eager does); hooks fire in the
    shared order: q, k, v, v_out, pattern, phantom (zeros: no sink), z.
    """
    if softcap is None:
        return _attn.probe_attention(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                     **kwargs)
    site = module.__dict__.get(_attn.SITE_KEY)
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    if site is not None:
        query, key = _bthd(site.hook_q(_bthd(query))), _bthd(site.hook_k(_bthd(key)))
        value = _bthd(site.hook_v_out(site.hook_v(_bthd(value))))
    n_rep = query.shape[1] // key.shape[1]
    scores = torch.matmul(query.float(), _attn.repeat_kv(key, n_rep).float().transpose(-1, -2)) * scaling
    scores = softcap * torch.tanh(scores / softcap)  # HF eager: before the mask
    mask = _attn._float_mask(attention_mask, query.shape[2], key.shape[2], query.device)
    pattern = torch.softmax(scores if mask is None else scores + mask, dim=-1)
    if site is not None:
        pattern = site.hook_pattern(pattern)
        site.hook_phantom(pattern.new_zeros(pattern.shape[:-1]))
    weights = pattern.to(query.dtype)
    probs = F.dropout(weights, p=dropout, training=True) if module.training and dropout > 0 else weights
    out = _bthd(torch.matmul(probs, _attn.repeat_kv(value, n_rep)))
    if site is not None:
        out = site.hook_z(out)
    return out.contiguous(), weights


def register_softcap() -> str:
    """Register :func:`softcap_attention` with transformers (idempotent; same mask as "probe"); returns its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(SOFTCAP_IMPLEMENTATION, softcap_attention)
    AttentionMaskInterface.register(SOFTCAP_IMPLEMENTATION, eager_mask)
    return SOFTCAP_IMPLEMENTATION


class GemmaAdapter(HookedHF):
    family = "gemma"
    # gemma3: the multimodal checkpoint; only its language model is hooked (text inputs)
    model_types = ("gemma2", "gemma3_text", "gemma3")

    layer_forward = staticmethod(sandwich_layer_forward)

    @staticmethod
    def decoder_layers(hf_model):
        base = hf_model.model
        return list(getattr(base, "language_model", base).layers)

    def _install(self, layers):
        super()._install(layers)
        if self._text_config(self.hf_model.config).attn_logit_softcapping:
            self.hf_model.set_attn_implementation(register_softcap())

    @staticmethod
    def _text_config(config):
        return config.get_text_config()

    def describe(self, config, name):
        text = self._text_config(config)
        extra = {"attn_scale": text.query_pre_attn_scalar ** -0.5,
                 "attn_logit_softcap": text.attn_logit_softcapping,
                 "final_logit_softcap": text.final_logit_softcapping,
                 "qk_norm": text.model_type != "gemma2", "sandwich_norms": True,
                 "model_type": config.model_type}
        return base_info(text, name, self.family, extra=extra)
