"""GPT-NeoX / Pythia adapter.

Quirks: ``attention.query_key_value`` fuses the projections with q|k|v interleaved per head (the output viewed as
(B,T,H,3·dh) splits into q, k, v along the last axis); rotary on the first ``rotary_pct`` (Pythia: 25%) of each head's
dims; QKV bias; parallel residual. hook_rot_q/hook_rot_k are after rotary, as the attention function receives them;
hook_q/hook_k before it (turned back by the layer's rotary tables: the projection is fused).

``hook_resid_mid`` under the parallel residual: resid_pre + attn_out (the stream after the attention write). The MLP
reads LayerNorm(resid_pre), not resid_mid, so editing resid_mid changes resid_post = resid_mid + mlp_out but not the
MLP's input. When resid_mid is not hooked the layer sums mlp_out + attn_out + resid_pre in HF's order (bit-exact).
With ``use_parallel_residual=False`` the layer is sequential and resid_mid is what the MLP reads.
"""

from __future__ import annotations

from probe.checkpoints.hooked_hf import HookedHF, base_info


def neox_layer_forward(layer, hooks, hidden_states, **kwargs):
    hidden_states = hooks.hook_resid_pre(hidden_states)
    attn_out, _ = layer.attention(layer.input_layernorm(hidden_states), **kwargs)
    attn_out = hooks.hook_attn_out(layer.post_attention_dropout(attn_out))
    if layer.use_parallel_residual:
        mlp_out = hooks.hook_mlp_out(layer.post_mlp_dropout(layer.mlp(layer.post_attention_layernorm(hidden_states))))
        if hooks.hook_resid_mid.has_hooks():
            mid = hooks.hook_resid_mid(attn_out + hidden_states)
            out = mlp_out + mid
        else:
            out = mlp_out + attn_out + hidden_states
    else:
        mid = hooks.hook_resid_mid(attn_out + hidden_states)
        mlp_out = hooks.hook_mlp_out(layer.post_mlp_dropout(layer.mlp(layer.post_attention_layernorm(mid))))
        out = mlp_out + mid
    return hooks.hook_resid_post(out)


class GPTNeoXAdapter(HookedHF):
    family = "gpt_neox"
    model_types = ("gpt_neox",)

    layer_forward = staticmethod(neox_layer_forward)

    @staticmethod
    def decoder_layers(hf_model):
        return list(hf_model.gpt_neox.layers)

    @staticmethod
    def attention_module(layer):
        return layer.attention

    def norm_names(self) -> dict[str, str]:
        return {"ln1": "input_layernorm", "ln2": "post_attention_layernorm"}

    def describe(self, config, name):
        d_head = config.hidden_size // config.num_attention_heads
        rope = getattr(config, "rope_parameters", None) or {}
        pct = rope.get("partial_rotary_factor", getattr(config, "rotary_pct", 1.0))
        return base_info(
            config,
            name,
            self.family,
            d_head=d_head,
            extra={"rotary_dims": int(d_head * pct), "parallel_residual": bool(config.use_parallel_residual)},
        )
