"""Gemma 2 / Gemma 3 adapter: sandwich norms, sliding/full layers, QK-norm (Gemma 3), attention-logit soft-capping
(Gemma 2), GQA, no sink.

Layer (HF's order): resid_pre → input_layernorm → self_attn → post_attention_layernorm → resid_mid = resid_pre + that
→ pre_feedforward_layernorm → mlp → post_feedforward_layernorm → resid_post = resid_mid + that. ``hook_embed`` is the
embedding already scaled by √d (Gemma's embedding module scales it). hook_q/hook_k are q_proj's / k_proj's outputs,
hook_q_normed/hook_k_normed QK-norm's (Gemma 3), hook_rot_q/hook_rot_k after rotary (local and global rotary bases per
layer type), as HF passes them to the attention function.

Attention scores are ``q·k · query_pre_attn_scalar^-½`` (not ``d_head^-½``), recorded as ``extra["attn_scale"]``.
Gemma 2 soft-caps them, ``cap · tanh(scores / cap)``, before the mask (``extra["attn_logit_softcap"]``). Both are
read through ``ModelInfo.attention_at`` (probe.hooks.attention_rules), and every call checks the module's own scaling
and soft-cap against it (``_attn.check_site``). :func:`softcap_attention` fires the same hooks as probe's shared
attention function with that cap inside ``hook_attn_scores`` and ``hook_pattern``, exactly as HF eager does, and
without a pattern hook computes the capped attention in query blocks (no T x T tensor,
docs/definitions.md#long-context). The final-logit soft-cap stays in HF's LM head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from probe.checkpoints import attention as _attn
from probe.checkpoints.hooked_hf import HookedHF, base_info
from probe.kernels.sink_attention import edits
from probe.kernels.sink_attention.reference import attention_probs

SOFTCAP_IMPLEMENTATION = "probe_softcap"


def sandwich_layer_forward(layer, hooks, hidden_states, **kwargs):
    """Gemma's decoder layer: each sub-layer output is normed again before it joins the residual stream."""
    hidden_states = hooks.hook_resid_pre(hidden_states)
    attn_out, _ = layer.self_attn(hidden_states=layer.input_layernorm(hidden_states), **kwargs)
    mid = hooks.hook_resid_mid(hidden_states + hooks.hook_attn_out(layer.post_attention_layernorm(attn_out)))
    mlp_out = hooks.hook_mlp_out(layer.post_feedforward_layernorm(layer.mlp(layer.pre_feedforward_layernorm(mid))))
    return hooks.hook_resid_post(mid + mlp_out)


def softcap_attention(
    module, query, key, value, attention_mask, scaling=None, dropout=0.0, softcap=None, sliding_window=None, **kwargs
):
    """probe's attention function with Gemma 2's attention-logit soft-cap; without a cap it is probe_attention.

    SDPA cannot soft-cap, so the capped scores are explicit: the whole pattern when it is materialised (a hook asks,
    as in probe_attention), else query blocks of ``_attn.query_blocks`` (no T x T tensor). Hooks fire in the shared
    order: rot_q, rot_k, v, v_out, attn_scores, pattern, phantom (zeros: no sink), lse, z.
    """
    if softcap is None:
        return _attn.probe_attention(
            module,
            query,
            key,
            value,
            attention_mask,
            scaling=scaling,
            dropout=dropout,
            sliding_window=sliding_window,
            **kwargs,
        )
    _attn.refuse_unknown(module, kwargs)
    site = module.__dict__.get(_attn.SITE_KEY)
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    query, key, value = _attn.fire_qkv(
        site, query, key, value, kwargs.get("position_ids"), kwargs.get("position_embeddings")
    )
    n_rep = query.shape[1] // key.shape[1]
    q_len, k_len = query.shape[2], key.shape[2]
    rules, mask = _attn.as_rules(attention_mask, sliding_window, q_len, k_len, query.device)
    _attn.check_site(site, scaling, rules, query, key, softcap)
    key, value = _attn.repeat_kv(key, n_rep), _attn.repeat_kv(value, n_rep)

    def probs(rows, cols, mask, hook=None):  # fp32 capped probabilities (B,H,rows,cols) and lse; cap before the mask
        window = rules.window if rules is not None and mask is None else None
        pattern, _, lse = _attn.eager_probs(
            query[:, :, rows], key[:, :, cols], mask, scaling, window=window, softcap=softcap, scores_hook=hook
        )
        return pattern, lse

    weights = None
    edit = edits.taken(None if site is None else site.hook_v_out)  # handed to this layer by a hook on hook_v_out
    if edit is not None or _attn.wants_pattern(site, module, dropout) or rules is None:  # the whole pattern
        if rules is not None:
            mask = None if rules.keep is None else rules.dense(slice(None), q_len, k_len, query.dtype, query.device)
        if edit is None:
            hook = site.hook_attn_scores if _attn.wants_scores(site) else None  # the capped scores, hidden keys -inf
            pattern, lse = probs(slice(None), slice(None), mask, hook)
        else:
            pattern, lse = edited_probs(edit, query, key, n_rep, rules, scaling, softcap)
            pattern, _, lse = _attn.fire_scores_of(site, pattern, None, lse, None)
        if site is not None:
            pattern = site.hook_pattern(pattern)
            site.hook_phantom(pattern.new_zeros(pattern.shape[:-1]))
            _attn.fire_pattern_norm(site, pattern, value)  # value repeated to the query heads: G = 1
        weights = pattern.to(query.dtype)
        p = F.dropout(weights, p=dropout, training=True) if module.training and dropout > 0 else weights
        out = torch.matmul(p, value)
    else:
        out = query.new_empty(*query.shape[:3], value.shape[-1])
        lse = query.new_empty(*query.shape[:3], dtype=torch.float32)  # (B, H, Tq); no phantom: over the real keys
        for rows, cols, block_mask in _attn.query_blocks(rules, q_len, k_len, query.dtype, query.device):
            pattern, lse[:, :, rows] = probs(rows, cols, block_mask)
            out[:, :, rows] = torch.matmul(pattern.to(query.dtype), value[:, :, cols])
    if _attn.wants_lse(site):
        site.hook_lse(lse)
    out = _attn._bthd(out)
    if site is not None:
        out = site.hook_z(out)
    return out.contiguous(), weights


def edited_probs(edit, query, key, n_rep: int, rules, scaling: float, softcap: float):
    """The capped probabilities (B,H,T,T) and lse under an attention edit, carried out as the kernels' op
    carries it out (probe.kernels.sink_attention.dispatch): a knockout puts -inf on key 0 of the chosen KV heads and
    query 0 of a knocked-out head keeps its clean row (all its mass on key 0); an eviction whose plan is the layer's
    own attention or one kept-first-keys rule (edits.eviction_plan) applies that rule. An eviction that needs the
    kept keys as a second attention merged by lse (a layer window wider than the eviction's, positions within the
    cache) is refused in one line. q and k (B,H,T,dh), k repeated to the query heads."""
    B, H, T = query.shape[:3]
    _attn.refuse_padded_edit(rules, edit)
    if key.shape[2] != T or rules is None:
        raise RuntimeError(
            f"an attention edit needs the whole unpadded sequence in one call; got {T} queries over {key.shape[2]} keys"
        )
    window, keep = rules.window, None
    if edit.keep is not None:
        plan = edits.eviction_plan(window, edit, T)
        if plan.kind == "merge":
            raise RuntimeError(
                "this eviction cannot be carried through Gemma 2's soft-capped attention: its kept first keys need "
                "a second attention merged by lse (a layer window wider than the eviction's, or positions within "
                "the cache), which the soft-capped path does not compute; use a full layer's eviction at original "
                "positions or a knockout"
            )
        if plan.kind == "rule":
            window, keep = plan.window, plan.keep
    bias = None
    if edit.knockout:
        bias = edits.knockout_bias(None, B, H // n_rep, T, edit.kv_heads, query.device).repeat_interleave(n_rep, 1)
    pattern, _, lse = attention_probs(
        _attn._bthd(query), _attn._bthd(key), key_bias=bias, window=window, scale=scaling, softcap=softcap, keep=keep
    )
    if edit.knockout:  # query 0 over key 0 alone: its clean row and lse
        empty = edits.empty_first_rows(None, H, H // n_rep, edit.kv_heads, query.device)  # (H,)
        pattern[:, empty, 0, 0] = 1.0
        score = (query[:, :, 0].float() * key[:, :, 0].float()).sum(-1) * scaling  # (B, H)
        lse[:, empty, 0] = (softcap * torch.tanh(score / softcap))[:, empty].to(lse.dtype)
    return pattern, lse


def softcapped_or_probe(info) -> str:
    """The attention implementation of a model with ``info``: the soft-capped function where a layer's scores are
    capped (``info.attention_at(layer).softcap``: Gemma 2, VaultGemma), else probe's."""
    capped = any(info.attention_at(layer).softcap for layer in info.attention_layers)
    return register_softcap() if capped else _attn.register()


def register_softcap() -> str:
    """Register :func:`softcap_attention` with transformers (idempotent; same mask builder as "probe"); returns its
    name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(SOFTCAP_IMPLEMENTATION, softcap_attention)
    AttentionMaskInterface.register(SOFTCAP_IMPLEMENTATION, _attn.rules_mask)
    return SOFTCAP_IMPLEMENTATION


# the sandwich layer's norms: on the attention's input and output, on the MLP's input and output
SANDWICH_NORMS = {
    "ln1": "input_layernorm",
    "ln1_post": "post_attention_layernorm",
    "ln2": "pre_feedforward_layernorm",
    "ln2_post": "post_feedforward_layernorm",
}


class GemmaAdapter(HookedHF):
    family = "gemma"
    # gemma3: the multimodal checkpoint; only its language model is hooked (text inputs)
    model_types = ("gemma2", "gemma3_text", "gemma3")

    layer_forward = staticmethod(sandwich_layer_forward)

    def attention_implementation(self) -> str:
        return softcapped_or_probe(self.probe_info)

    @staticmethod
    def decoder_layers(hf_model):
        base = hf_model.model
        return list(getattr(base, "language_model", base).layers)

    @staticmethod
    def _text_config(config):
        return config.get_text_config()

    def norm_names(self) -> dict[str, str]:
        return SANDWICH_NORMS

    def describe(self, config, name):
        text = self._text_config(config)
        extra = {
            "attn_scale": text.query_pre_attn_scalar**-0.5,
            "attn_logit_softcap": text.attn_logit_softcapping,
            "final_logit_softcap": text.final_logit_softcapping,
            "qk_norm": text.model_type != "gemma2",
            "sandwich_norms": True,
            "model_type": config.model_type,
        }
        return base_info(text, name, self.family, extra=extra)


def gemma4_layer_forward(layer, hooks, hidden_states, per_layer_input=None, **kwargs):
    """Gemma 4's text layer: Gemma's sandwich norms, an optional expert block beside the MLP, the per-layer input
    (its own embedding of each token, gated into the stream) and a learned layer scalar on the layer's output."""
    resid = hooks.hook_resid_pre(hidden_states)
    attn_out, _ = layer.self_attn(hidden_states=layer.input_layernorm(resid), **kwargs)
    mid = hooks.hook_resid_mid(resid + hooks.hook_attn_out(layer.post_attention_layernorm(attn_out)))
    ff = layer.mlp(layer.pre_feedforward_layernorm(mid))
    if layer.enable_moe_block:
        flat = mid.reshape(-1, mid.shape[-1])
        _, weights, index = layer.router(flat)
        experts = layer.experts(layer.pre_feedforward_layernorm_2(flat), index, weights).reshape(mid.shape)
        ff = layer.post_feedforward_layernorm_1(ff) + layer.post_feedforward_layernorm_2(experts)
    # the MLP's write (its MLP and expert branches after their norms). The per-layer input's write and the layer
    # scalar below are no sub-layer's: resid_post = (resid_mid + mlp_out + that write) · layer_scalar, so the
    # resid_post rule cannot hold here (the coverage table lists Gemma 4 as partial on it)
    out = mid + hooks.hook_mlp_out(layer.post_feedforward_layernorm(ff))
    if layer.hidden_size_per_layer_input:
        gated = layer.act_fn(layer.per_layer_input_gate(out)) * per_layer_input
        out = out + layer.post_per_layer_input_norm(layer.per_layer_projection(gated))
    return hooks.hook_resid_post(out * layer.layer_scalar)


class Gemma4Adapter(HookedHF):
    """Gemma 4 (text, and the text model of the multimodal checkpoint): sliding and full layers whose head width
    differs (per_layer_config), attention scale 1 (QK-norm), per-layer inputs, a layer scalar."""

    family = "gemma4"
    model_types = ("gemma4_text", "gemma4")
    layer_forward = staticmethod(gemma4_layer_forward)
    decoder_layers = staticmethod(GemmaAdapter.decoder_layers)
    norm_names = GemmaAdapter.norm_names  # the same sandwich norms

    def describe(self, config, name):
        text = config.get_text_config()
        extra = {"attn_logit_softcap": None, "final_logit_softcap": text.final_logit_softcapping}
        first = self.decoder_layers(self.hf_model)[0].self_attn.head_dim  # full layers may be wider (per layer)
        return base_info(text, name, self.family, d_head=first, extra=extra)
