"""Llama-family adapter (llama, mistral, qwen2, qwen3, …): pre-norm, sequential residual, GQA, no sink.

Layer: resid_pre → input_layernorm → self_attn → resid_mid = resid_pre + attn_out → post_attention_layernorm →
mlp → resid_post = resid_mid + mlp_out (HF's own order of operations, so the unedited forward matches HF exactly).
"""

from __future__ import annotations

from probe.checkpoints.hooked_hf import HookedHF, base_info


def sequential_layer_forward(layer, hooks, hidden_states, **kwargs):
    """Pre-norm sequential decoder layer; MLPs that also return router scores (MoE) are unpacked."""
    hidden_states = hooks.hook_resid_pre(hidden_states)
    attn_out, _ = layer.self_attn(hidden_states=layer.input_layernorm(hidden_states), **kwargs)
    mid = hooks.hook_resid_mid(hidden_states + attn_out)
    mlp_out = layer.mlp(layer.post_attention_layernorm(mid))
    if isinstance(mlp_out, tuple):
        mlp_out = mlp_out[0]
    return hooks.hook_resid_post(mid + mlp_out)


class LlamaAdapter(HookedHF):
    family = "llama"
    model_types = ("llama", "mistral", "qwen2", "qwen3")

    layer_forward = staticmethod(sequential_layer_forward)

    def describe(self, config, name):
        return base_info(config, name, self.family)
