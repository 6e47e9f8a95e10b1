"""Families whose attention module computes its scores itself, outside transformers' attention interface: BLOOM and
MPT (ALiBi), Falcon (rotary; its ALiBi variant is refused) and GPT-Neo (no score scale, local layers).

Their layer forwards here compute q, k, v with the module's own weights and in HF's layout, then call probe's
attention function, so the attention hooks and kernels are the generic route's. ALiBi is a per-head slope times the
key's position added to each logit (plus a per-row constant that softmax ignores), so it is the kernels' per-key
bias: ``key_bias = ModelInfo.attention_at(layer).alibi_bias`` (B,H,T), the same bias the streaming analyses rebuild
the scores with (docs/definitions.md#hf-checkpoints). BLOOM's and MPT's modules add the residual inside the
attention and the MLP; here the residual is added outside them (the MLP is called with a zero residual: x + 0 is x),
so ``hook_attn_out`` / ``hook_mlp_out`` are what each sub-layer adds (its output after its dropout), as in every
other family.

transformers' model builds the mask through probe's mask builder (``config._attn_implementation = "probe"``); the
attention module's own eager branch never runs.
"""

from __future__ import annotations

import dataclasses
import types

import torch
import torch.nn.functional as F

from probe.checkpoints import attention as _attn
from probe.checkpoints.adapters.recipes import Layer, RecipeAdapter
from probe.checkpoints.hooked_hf import INSTANCE_FORWARDS


class OwnAttentionAdapter(RecipeAdapter):
    """A family whose attention module computes its own scores: the model's masks come from probe's mask builder
    (its attention implementation is not switchable, so the config names it), and the layer bodies call probe's
    attention function."""

    uses_attention_interface = False


def _key_bias(module, batch: int, length: int, given: torch.Tensor, device) -> torch.Tensor:
    """(B,H,Tk) ALiBi logits: the model's own (its positions count from each row's first real token) unless they
    equal probe_info's slopes times the key's position up to a per-row constant (no padding), then probe_info's,
    which the streaming analyses use too."""
    site = module.__dict__[_attn.SITE_KEY]
    ours = site.info.attention_at(site.layer).alibi_bias(batch, length, device, given.dtype).to(given.dtype)
    shift = given - ours
    return ours if torch.allclose(shift, shift[..., :1].expand_as(shift), atol=1e-5) else given


def _attend(module, q, k, v, mask, scaling: float, key_bias=None, window=None, position_embeddings=None):
    """probe's attention function on (B,H,T,dh) q/k/v as HF lays them out; returns (B,T,H*dh). ``position_embeddings``:
    the rotary's (cos, sin) q and k were turned by (what hook_q is turned back by: the projection is fused)."""
    out, _ = _attn.probe_attention(
        module,
        q,
        k,
        v,
        mask,
        scaling=scaling,
        dropout=0.0,
        sliding_window=window,
        key_bias=key_bias,
        position_embeddings=position_embeddings,
    )
    return out.reshape(*out.shape[:2], -1)


# --- BLOOM ------------------------------------------------------------------------------------------------------


def bloom_attention(attn, hidden, alibi, mask, layer_past=None):
    B, T, _ = hidden.shape
    q, k, v = attn._reshape(attn.query_key_value(hidden))  # (B,H,T,dh) each
    if layer_past is not None:
        k, v = layer_past.update(k, v, attn.layer_idx)
    bias = _key_bias(attn, B, k.shape[2], alibi.view(B, attn.num_heads, -1)[..., -k.shape[2] :], hidden.device)
    return attn.dense(_attend(attn, q, k, v, mask, attn.inv_norm_factor, bias))


def bloom_layer_forward(layer, hooks, hidden_states, *, alibi, attention_mask, layer_past=None, **kwargs):
    """BLOOM's block: LayerNorm → attention (+ the residual, or the normed input with
    apply_residual_connection_post_layernorm) → LayerNorm → MLP (+ the same choice of residual). With that option the
    stream a sub-layer adds to is its normed input, not resid_pre / resid_mid, so the residual algebra does not hold
    (no released BLOOM sets it)."""
    post = layer.apply_residual_connection_post_layernorm
    resid = hooks.hook_resid_pre(hidden_states)
    normed = layer.input_layernorm(resid)
    attn_out = bloom_attention(layer.self_attention, normed, alibi, attention_mask, layer_past)
    # HF's attention drops its output out before adding it: the write is the dropped-out output
    attn_out = F.dropout(attn_out, p=layer.self_attention.hidden_dropout, training=layer.training)
    attn_out = hooks.hook_attn_out(attn_out)
    mid = hooks.hook_resid_mid((normed if post else resid) + attn_out)
    normed = layer.post_attention_layernorm(mid)
    base = normed if post else mid
    mlp_out = hooks.hook_mlp_out(layer.mlp(normed, torch.zeros_like(base)))
    return hooks.hook_resid_post(base + mlp_out), None


class BloomAdapter(OwnAttentionAdapter):
    """BLOOM: ALiBi, fused query_key_value (per head q|k|v), LayerNorm on the embeddings."""

    family = "bloom"
    model_types = ("bloom",)
    recipe = Layer(attn_norm="input_layernorm", mlp_norm="post_attention_layernorm", attn="self_attention")
    layer_forward = staticmethod(bloom_layer_forward)

    @staticmethod
    def embedding_module(hf_model):
        # the stream starts after the embedding LayerNorm: hook_embed = blocks.0.hook_resid_pre (TL's bridge too)
        return hf_model.transformer.word_embeddings_layernorm

    def refuse(self, config):
        if config.pretraining_tp > 1 and config.slow_but_exact:
            return "slow_but_exact with pretraining_tp > 1 (sliced output projections)"
        return None

    def extra(self, config):
        from transformers.models.bloom.modeling_bloom import build_alibi_tensor

        return {"alibi_slopes": build_alibi_tensor(torch.ones(1, 2), config.n_head, torch.float32)[:, 0, 1].tolist()}


# --- MPT --------------------------------------------------------------------------------------------------------


def mpt_attention(attn, hidden, position_bias, mask, cache=None):
    B, T, _ = hidden.shape
    qkv = attn.Wqkv(hidden)
    if attn.clip_qkv:
        qkv = qkv.clamp(min=-attn.clip_qkv, max=attn.clip_qkv)
    q, k, v = (x.reshape(B, T, attn.n_heads, attn.head_dim).transpose(1, 2) for x in qkv.chunk(3, dim=2))
    if cache is not None:
        k, v = cache.update(k, v, attn.layer_idx)
    given = position_bias[:, 0, -k.shape[2] :][None].expand(B, -1, -1)  # (H,1,Tk) -> (B,H,Tk)
    bias = _key_bias(attn, B, k.shape[2], given, hidden.device)
    if mask is not None:  # MPT's model hands a bool mask, True where a key is masked: additive here
        mask = torch.zeros(mask.shape, device=mask.device).masked_fill(mask, float("-inf"))
    return attn.out_proj(_attend(attn, q, k, v, mask, attn.softmax_scale, bias))


def mpt_layer_forward(layer, hooks, hidden_states, *, position_bias, attention_mask, layer_past=None, **kwargs):
    """MPT's block: norm_1 → attention → + residual → norm_2 → ffn → + residual."""
    resid = hooks.hook_resid_pre(hidden_states)
    attn_out = mpt_attention(layer.attn, layer.norm_1(resid), position_bias, attention_mask, layer_past)
    mid = hooks.hook_resid_mid(hooks.hook_attn_out(layer.resid_attn_dropout(attn_out)) + resid)  # the write, dropped
    mlp_out = hooks.hook_mlp_out(layer.ffn(layer.norm_2(mid), torch.zeros_like(mid)))
    return hooks.hook_resid_post(mid + mlp_out), None


class MptAdapter(OwnAttentionAdapter):
    """MPT: ALiBi (slopes 2^-8h/H), fused Wqkv (optionally clipped), no biases."""

    family = "mpt"
    model_types = ("mpt",)
    recipe = Layer(attn_norm="norm_1", mlp_norm="norm_2", attn="attn", mlp="ffn")
    layer_forward = staticmethod(mpt_layer_forward)

    def _install(self, layers):
        super()._install(layers)
        self.hf_model.config._attn_implementation = "eager"  # MPT's model casts its mask to bool: eager's dense one

    def refuse(self, config):
        if not config.attn_config.alibi:
            return "attn_config.alibi=False (MPT without position information in its attention)"
        return None

    def extra(self, config):
        from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

        bias = build_mpt_alibi_tensor(config.n_heads, 2, config.attn_config.alibi_bias_max)  # (H,1,2)
        return {"alibi_slopes": (bias[:, 0, 1] - bias[:, 0, 0]).tolist()}


# --- Falcon -----------------------------------------------------------------------------------------------------


def falcon_attention(attn, hidden, mask, position_embeddings, layer_past=None):
    if not hasattr(attn, "_split_heads"):  # transformers 5.25: Falcon's attention calls the attention interface
        return attn(hidden, attention_mask=mask, position_embeddings=position_embeddings, layer_past=layer_past)[0]
    B, T, _ = hidden.shape
    kv_heads = attn.num_heads if attn.new_decoder_architecture else attn.num_kv_heads
    q, k, v = attn._split_heads(attn.query_key_value(hidden))
    q = q.transpose(1, 2).reshape(B, attn.num_heads, T, attn.head_dim)
    k = k.transpose(1, 2).reshape(B, kv_heads, T, attn.head_dim)
    v = v.transpose(1, 2).reshape(B, kv_heads, T, attn.head_dim)
    from transformers.models.falcon.modeling_falcon import apply_rotary_pos_emb

    q, k = apply_rotary_pos_emb(q, k, *position_embeddings)  # rotary: ALiBi Falcon is refused (FalconAdapter)
    if layer_past is not None:
        k, v = layer_past.update(k, v, attn.layer_idx)
    return attn.dense(_attend(attn, q, k, v, mask, attn.inv_norm_factor, position_embeddings=position_embeddings))


def falcon_layer_forward(layer, hooks, hidden_states, *, attention_mask, alibi=None, layer_past=None, **kwargs):
    """Falcon's layer in its three layouts: parallel attention + MLP on one LayerNorm (7B), on two (the new
    decoder architecture, 40B / 180B), or sequential (parallel_attn=False). ``alibi``: transformers before 5.25 passed
    it (unused: ALiBi Falcon is refused); 5.25 folds it into the mask."""
    config = layer.config
    resid = hooks.hook_resid_pre(hidden_states)
    two_norms = config.new_decoder_architecture and config.num_ln_in_parallel_attn == 2
    attn_in = layer.ln_attn(resid) if two_norms else layer.input_layernorm(resid)
    attn_out = falcon_attention(
        layer.self_attention, attn_in, attention_mask, kwargs.get("position_embeddings"), layer_past
    )
    parallel = config.new_decoder_architecture or config.parallel_attn
    drop = _dropout(resid, config.hidden_dropout if parallel else config.attention_dropout, layer.training)
    attn_out = hooks.hook_attn_out(drop(attn_out))  # the write, as HF drops it out before adding it
    if parallel:
        mlp_in = layer.ln_mlp(resid) if two_norms else attn_in
        mlp_out = hooks.hook_mlp_out(drop(layer.mlp(mlp_in)))
        if hooks.hook_resid_mid.has_hooks():
            return hooks.hook_resid_post(hooks.hook_resid_mid(resid + attn_out) + mlp_out), None
        return hooks.hook_resid_post((mlp_out + attn_out) + resid), None  # HF's order: mlp += attn; + residual
    mid = hooks.hook_resid_mid(attn_out + resid)
    mlp_out = layer.mlp(layer.post_attention_layernorm(mid))
    mlp_out = hooks.hook_mlp_out(_dropout(mid, config.hidden_dropout, layer.training)(mlp_out))
    return hooks.hook_resid_post(mlp_out + mid), None


def _dropout(like: torch.Tensor, p: float, training: bool):
    """x -> x dropped out with one mask shaped as ``like`` (B,T,d), whatever x it is applied to: a parallel Falcon
    block drops the sum of its two writes with one mask, which is each write dropped with that mask, so each hook
    sees its write as it is added. The identity in eval."""
    if not training or not p:
        return lambda x: x
    keep = F.dropout(torch.ones_like(like), p=p, training=True)  # B,T,d: 0 or 1 / (1 - p)
    return lambda x: x * keep


class FalconAdapter(OwnAttentionAdapter):
    """Falcon: multi-query (or grouped, in the new decoder architecture) attention with rotary positions."""

    family = "falcon"
    model_types = ("falcon",)
    recipe = Layer(attn_norm="input_layernorm", mlp_norm=None, attn="self_attention")
    layer_forward = staticmethod(falcon_layer_forward)

    def norm_names(self) -> dict[str, str]:
        # falcon_layer_forward's layouts: two norms side by side, one shared by attention and MLP, or sequential
        config = self.hf_model.config
        if config.parallel_attn and config.num_ln_in_parallel_attn == 2:
            return {"ln1": "ln_attn", "ln2": "ln_mlp"}
        return {"ln1": "input_layernorm"} | ({} if config.parallel_attn else {"ln2": "post_attention_layernorm"})

    def refuse(self, config):
        if config.alibi:  # measured: its attention equals softmax(q·k/√d + 2 · slope · j), not ALiBi's single bias
            return (
                "alibi=True (Falcon-RW): transformers' Falcon adds the ALiBi bias twice, once in the mask its model "
                "builds and once in the attention, which probe does not reproduce"
            )
        return None


# --- GPT-Neo ----------------------------------------------------------------------------------------------------


def _windowed(mask, window: int):
    """The mask a GPT-Neo local layer applies: the model's (causal, padding) and the last ``window`` keys."""
    if mask is None or isinstance(mask, _attn.MaskRules):
        return dataclasses.replace(mask or _attn.MaskRules(), window=window)
    q_len, k_len = mask.shape[-2:]
    visible = _attn.MaskRules(window=window).visible(slice(None), q_len, k_len, mask.device)
    return mask.masked_fill(~visible, torch.finfo(mask.dtype).min)


def neo_attention_forward(self, hidden_states, attention_mask=None, layer_past=None, **kwargs):
    """GPT-Neo's self-attention (installed on the inner module): scores q·k unscaled, in fp32 as HF computes them,
    local layers within the last window_size keys."""
    q, k, v = (
        self._split_heads(p(hidden_states), self.num_heads, self.head_dim)
        for p in (self.q_proj, self.k_proj, self.v_proj)
    )
    if layer_past is not None:
        k, v = layer_past.update(k, v, self.layer_id)
    local = self.attention_type == "local"
    mask = _windowed(attention_mask, self.config.window_size) if local else attention_mask
    out = _attend(self, q.float(), k.float(), v.float(), mask, 1.0).to(v.dtype)
    return self.resid_dropout(self.out_proj(out)), None


class GPTNeoAdapter(RecipeAdapter):
    """GPT-Neo: alternating global and local (sliding-window) layers, attention scores without the 1/sqrt(d) scale,
    learned absolute positions."""

    family = "gpt_neo"
    model_types = ("gpt_neo",)
    recipe = Layer(attn_norm="ln_1", mlp_norm="ln_2", attn="attn", returns_weights=True)
    uses_attention_interface = False

    def attention_module(self, layer):
        return layer.attn.attention

    def describe(self, config, name):
        info = super().describe(config, name)
        info.layer_types = ["sliding" if kind == "local" else "full" for kind in config.attention_layers]
        info.sliding_window = config.window_size if "sliding" in info.layer_types else None
        info.extra["attn_scale"] = 1.0
        return info

    def _install(self, layers):
        super()._install(layers)
        for layer in layers:
            inner = self.attention_module(layer)
            inner.forward = types.MethodType(neo_attention_forward, inner)


INSTANCE_FORWARDS.add(neo_attention_forward)
