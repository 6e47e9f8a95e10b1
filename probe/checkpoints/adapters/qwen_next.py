"""Qwen3-Next / Qwen3.5 adapter: hybrids of linear-attention layers (Gated DeltaNet: "linear" layers, no softmax
attention and so no attention hooks, never a fake pattern) and full-attention layers whose output is gated.

The gate (Qiu et al. 2025's G1, docs/definitions.md#output-gates): q_proj emits each head's query and a gate of the
same width; after the attention, the heads' output is multiplied by σ(gate) element-wise, before o_proj. Here
``attn.hook_out_gate`` (B,T,H,dh) is that σ, the gate value in [0, 1], and ``attn.hook_z`` is the gated output, so
an edit of either reaches o_proj. HF's attention forward runs unchanged; two module hooks carry the gate: one on
q_proj keeps the gate half of its output, one before o_proj replaces o_proj's input (HF's own gated product) with
hook_z(z · hook_out_gate(σ(gate))), z being the ungated output the attention function handed back — the same
elementwise product, so the unedited forward is HF's.

Layer: resid_pre → input_layernorm → linear_attn or self_attn → resid_mid → post_attention_layernorm → mlp (a
mixture of experts with a shared expert in the MoE variants) → resid_post.
"""

from __future__ import annotations

import torch

from probe.checkpoints.adapters.recipes import Layer, RecipeAdapter

GATE_KEY = "_probe_gate_site"  # q_proj / o_proj __dict__ entry -> the layer's attention hooks


def hybrid_layer_forward(layer, hooks, hidden_states, **kwargs):
    """Qwen3-Next's decoder layer: the token mixer is the linear attention or the gated softmax attention."""
    resid = hooks.hook_resid_pre(hidden_states)
    normed = layer.input_layernorm(resid)
    if layer.block_type == "linear_attention":  # HF hands it the cache, the mask and the model's extra keywords
        linear = {k: v for k, v in kwargs.items() if k not in ("position_ids", "position_embeddings")}
        mixer = getattr(layer, "linear_attn", None) or layer.self_attn  # Kimi / Bailing name theirs self_attn
        mixed = mixer(hidden_states=normed, **linear)
    else:
        mixed, _ = layer.self_attn(hidden_states=normed, **kwargs)
    mid = hooks.hook_resid_mid(resid + hooks.hook_attn_out(mixed))  # a linear layer's mixer output too
    out = layer.mlp(layer.post_attention_layernorm(mid))
    out = out[0] if isinstance(out, tuple) else out
    return hooks.hook_resid_post(mid + hooks.hook_mlp_out(out.view(mid.shape)))


def keep_gate(module, inputs, output):
    """Forward hook on q_proj: the gate half of each head's query-and-gate (HF's view and chunk)."""
    site = module.__dict__.get(GATE_KEY)
    if site is not None:
        head_dim = site.heads[2]
        site.pending_gate = torch.chunk(output.view(*output.shape[:-1], -1, head_dim * 2), 2, dim=-1)[1]
    return None


def gate_output(module, args):
    """Forward pre-hook on o_proj: its input becomes hook_z(z · hook_out_gate(σ(gate)))."""
    site = module.__dict__.get(GATE_KEY)
    if site is None or site.pending_z is None:
        return None
    gate = site.hook_out_gate(torch.sigmoid(site.pending_gate))  # B,T,H,dh
    z = site.hook_z(site.pending_z * gate)
    site.pending_z = site.pending_gate = None
    return (z.reshape(*z.shape[:2], -1),)


def attach_output_gate(site, gate_source, keep, o_proj, query_gated: bool = False) -> None:
    """An elementwise output gate on one layer's attention: ``keep`` (a forward hook on ``gate_source``) stores the
    gate logits on ``site``, and ``gate_output`` (before ``o_proj``) fires hook_out_gate and the gated hook_z.
    ``query_gated``: the gate is half of q_proj's output (Qwen3-Next), so hook_q reads the query half."""
    site.gated, site.query_gated = True, query_gated
    gate_source.__dict__[GATE_KEY] = o_proj.__dict__[GATE_KEY] = site
    if keep not in gate_source._forward_hooks.values():
        gate_source.register_forward_hook(keep)
    if gate_output not in o_proj._forward_pre_hooks.values():
        o_proj.register_forward_pre_hook(gate_output)


def describe_output_gate(info):
    """``info`` (a ModelInfo) marked with an elementwise output gate."""
    info.has_out_gate, info.out_gate = True, "elementwise"
    return info


class HybridAdapter(RecipeAdapter):
    """Linear-attention / softmax-attention hybrids with Qwen3-Next's layer: Lara-mini, Kimi Linear, Bailing."""

    family = "hybrid"
    model_types = ("lara_mini", "kimi_linear", "bailing_hybrid")
    recipe = Layer(attn_norm="input_layernorm", mlp_norm="post_attention_layernorm")
    layer_forward = staticmethod(hybrid_layer_forward)

    def attention_module(self, layer):
        return None if layer.block_type == "linear_attention" else layer.self_attn


class GatedHybridAdapter(HybridAdapter):
    """Qwen3-Next / Qwen3.5: the hybrid layer, its full-attention output gated (module docstring)."""

    family = "qwen3_next"
    model_types = ("qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")

    def describe(self, config, name):
        return describe_output_gate(super().describe(config, name))

    def _install(self, layers):
        super()._install(layers)
        for layer, block in zip(layers, self.blocks):
            attn = self.attention_module(layer)
            if attn is None:
                continue
            attach_output_gate(block.attn, attn.q_proj, keep_gate, attn.o_proj, query_gated=True)


def lfm2_layer_forward(layer, hooks, hidden_states, **kwargs):
    """LFM2 / LFM3: an operator (attention, or a short convolution) and a feed-forward, each on its normed input (LFM3
    norms each output too)."""
    resid = hooks.hook_resid_pre(hidden_states)
    normed = layer.operator_norm(resid)
    if layer.is_attention_layer:
        mixed, _ = layer.self_attn(hidden_states=normed, **kwargs)
    else:
        mixed = layer.conv(hidden_states=normed, cache=kwargs.get("cache"), attention_mask=kwargs.get("attention_mask"))
    post = getattr(layer, "post_operator_norm", None)
    mid = hooks.hook_resid_mid(resid + hooks.hook_attn_out(mixed if post is None else post(mixed)))
    out = layer.feed_forward(layer.ffn_norm(mid))
    post = getattr(layer, "post_ffn_norm", None)
    return hooks.hook_resid_post(mid + hooks.hook_mlp_out(out if post is None else post(out)))


class Lfm2Adapter(RecipeAdapter):
    """LFM2 / LFM3 (Liquid): short-convolution layers ("linear": no attention) between attention layers."""

    family = "lfm2"
    model_types = ("lfm2", "lfm3")
    recipe = Layer(attn_norm="operator_norm", mlp_norm="ffn_norm", mlp="feed_forward")
    layer_forward = staticmethod(lfm2_layer_forward)

    def attention_module(self, layer):
        return layer.self_attn if layer.is_attention_layer else None


def olmo_hybrid_layer_forward(layer, hooks, hidden_states, **kwargs):
    """OLMo-hybrid: its linear-attention layers are pre-norm, its attention layers OLMo 2's post-norm ones."""
    resid = hooks.hook_resid_pre(hidden_states)
    if hasattr(layer, "linear_attn"):
        linear = {k: v for k, v in kwargs.items() if k not in ("position_ids", "position_embeddings")}
        mixed = layer.linear_attn(hidden_states=layer.input_layernorm(resid), **linear)
        mid = hooks.hook_resid_mid(resid + hooks.hook_attn_out(mixed))
        return hooks.hook_resid_post(mid + hooks.hook_mlp_out(layer.mlp(layer.post_attention_layernorm(mid))))
    attn_out, _ = layer.self_attn(hidden_states=resid, **kwargs)
    mid = hooks.hook_resid_mid(resid + hooks.hook_attn_out(layer.post_attention_layernorm(attn_out)))
    return hooks.hook_resid_post(mid + hooks.hook_mlp_out(layer.post_feedforward_layernorm(layer.mlp(mid))))


class OlmoHybridAdapter(RecipeAdapter):
    family = "olmo_hybrid"
    model_types = ("olmo_hybrid",)
    recipe = Layer(attn_norm=None, mlp_norm=None)
    layer_forward = staticmethod(olmo_hybrid_layer_forward)

    def attention_module(self, layer):
        return getattr(layer, "self_attn", None)
