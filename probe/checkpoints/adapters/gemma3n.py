"""Gemma 3n text adapter: Gemma's sandwich norms with AltUp streams, a LAuReL branch and per-layer inputs.

What transformers' ``modeling_gemma3n.py`` computes, and what the hooks see of it:

* **AltUp.** The model keeps ``altup_num_inputs`` = N streams (the embedding and N − 1 projections of it, rescaled to
  its magnitude), held as N,B,T,d. Each layer first *predicts* every stream from all of them (coefficients from the
  active stream ``altup_active_idx``); only the active prediction runs through attention and the MLP; then it
  *corrects* every prediction by the active stream's innovation (coefficients again from the output), scales the
  active one by ``correct_output_scale``, gates it with the layer's per-layer input (the token's own embedding for
  this layer) and adds that to the other streams. After the last layer the streams are projected back, rescaled and
  averaged before the final norm. Hooks: ``hook_streams`` (B,T,N,d) is the layer's input streams; ``hook_resid_pre``
  the active prediction, ``hook_resid_post`` the active stream before the correction; the correction and the
  per-layer input are no sub-layer's write, so resid_post of one layer is not resid_pre of the next.
* **LAuReL.** Beside attention, a low-rank branch reads the normed active prediction: laurel = x + norm(R·L·x). The
  stream after attention is (resid_pre + attn_out + laurel) / √2 (``hook_resid_mid``), so resid_pre + attn_out =
  resid_mid does not hold (the coverage table lists the rule as broken, by design); resid_mid + mlp_out =
  resid_post does.
* **Attention** is Gemma 3's (QK-norm, sliding and full layers), through probe's attention function; a layer that
  reuses an earlier layer's keys and values (``num_kv_shared_layers``) hands those to it.
"""

from __future__ import annotations

import math

from transformer_lens.hook_points import HookPoint

from probe.checkpoints.adapters.gemma import GemmaAdapter
from probe.checkpoints.hooked_hf import HookedHF, base_info


def altup_layer_forward(layer, hooks, hidden_states, position_embeddings=None, per_layer_input=None, **kwargs):
    """Gemma 3n's decoder layer (N,B,T,d -> N,B,T,d) with the stream and residual hooks (module docstring)."""
    active = layer.config.altup_active_idx
    streams = hooks.hook_streams(hidden_states.permute(1, 2, 0, 3)).permute(2, 0, 1, 3)  # B,T,N,d seen
    predictions = layer.altup.predict(streams)
    resid = hooks.hook_resid_pre(predictions[active])
    normed = layer.input_layernorm(resid)
    laurel = layer.laurel(normed)
    attn, _ = layer.self_attn(hidden_states=normed, position_embeddings=position_embeddings, **kwargs)
    attn_out = hooks.hook_attn_out(layer.post_attention_layernorm(attn))
    mid = hooks.hook_resid_mid((resid + attn_out + laurel) / math.sqrt(2))
    mlp_out = hooks.hook_mlp_out(layer.post_feedforward_layernorm(layer.mlp(layer.pre_feedforward_layernorm(mid))))
    out = hooks.hook_resid_post(mid + mlp_out)
    corrected = layer.altup.correct(predictions, out)
    first = corrected[active].clone()
    if layer.config.altup_correct_scale:
        first = layer.altup.scale_corrected_output(first)
    first = layer.per_layer_projection(layer.act_fn(layer.per_layer_input_gate(first)) * per_layer_input)
    corrected[1:] += layer.post_per_layer_input_norm(first)
    return corrected


class Gemma3nAdapter(HookedHF):
    family = "gemma3n"
    model_types = ("gemma3n_text",)
    layer_forward = staticmethod(altup_layer_forward)
    decoder_layers = staticmethod(GemmaAdapter.decoder_layers)
    norm_names = GemmaAdapter.norm_names  # the same sandwich norms

    def describe(self, config, name):
        text = config.get_text_config()
        extra = {
            "attn_logit_softcap": None,
            "final_logit_softcap": text.final_logit_softcapping,
            "altup_streams": text.altup_num_inputs,
            "altup_active": text.altup_active_idx,
        }
        return base_info(text, name, self.family, extra=extra)

    def _install(self, layers):
        for block in self.blocks:
            block.hook_streams = HookPoint()  # B,T,N,d
        super()._install(layers)
