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
        mixed = layer.linear_attn(hidden_states=normed, **linear)
    else:
        mixed, _ = layer.self_attn(hidden_states=normed, **kwargs)
    mid = hooks.hook_resid_mid(resid + mixed)
    out = layer.mlp(layer.post_attention_layernorm(mid))
    out = out[0] if isinstance(out, tuple) else out
    return hooks.hook_resid_post(mid + out)


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


class GatedHybridAdapter(RecipeAdapter):
    family = "qwen3_next"
    model_types = ("qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")
    recipe = Layer(attn_norm="input_layernorm", mlp_norm="post_attention_layernorm")
    layer_forward = staticmethod(hybrid_layer_forward)

    def attention_module(self, layer):
        return None if layer.block_type == "linear_attention" else layer.self_attn

    def extra(self, config):
        return {"out_gate_of": "q_proj"}

    def describe(self, config, name):
        info = super().describe(config, name)
        info.has_out_gate, info.out_gate = True, "elementwise"
        return info

    def _install(self, layers):
        super()._install(layers)
        for layer, block in zip(layers, self.blocks):
            attn = self.attention_module(layer)
            if attn is None:
                continue
            block.attn.gated = True
            attn.q_proj.__dict__[GATE_KEY] = attn.o_proj.__dict__[GATE_KEY] = block.attn
            if keep_gate not in attn.q_proj._forward_hooks.values():
                attn.q_proj.register_forward_hook(keep_gate)
            if gate_output not in attn.o_proj._forward_pre_hooks.values():
                attn.o_proj.register_forward_pre_hook(gate_output)
