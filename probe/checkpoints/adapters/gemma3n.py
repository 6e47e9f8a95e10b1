"""Gemma 3n text adapter: Gemma's sandwich norms with AltUp streams, a LAuReL branch and per-layer inputs.

What transformers' ``modeling_gemma3n.py`` computes, and what the hooks see of it (n = ``altup_num_inputs``, p =
``hidden_size_per_layer_input``):

* **AltUp.** The model keeps n streams (the embedding and n − 1 projections of it, rescaled to its magnitude), held as
  n,B,T,d. Each layer first *predicts* every stream from all of them: prediction k = stream k + Σ_j c[k,j]·stream j,
  with c = a linear map of tanh(router(norm(active stream))) (``altup_active_idx``); only the active prediction runs
  through attention and the MLP; then it *corrects* every prediction by the active stream's innovation: stream k
  after = prediction k + e_k·(resid_post − resid_pre), e_k = 1 + a linear map of the router on resid_post. Hooks:
  ``hook_streams`` (B,T,n,d) the layer's input streams; ``altup.hook_predict`` (B,T,n,n, out × in) and
  ``altup.hook_correct`` (B,T,n) the two coefficient sets; ``hook_resid_pre`` the active prediction (an edit of it
  is the active prediction the correction starts from); ``hook_streams_post`` (B,T,n,d) the corrected streams with
  the per-layer write, what the next layer's ``hook_streams`` is. After the last layer the streams are projected back,
  rescaled and averaged before the final norm.
* **LAuReL.** Beside attention a low-rank branch reads the normed active prediction x = ln1(resid_pre):
  ``hook_laurel_out`` (B,T,d) = x + norm(R·L·x), and the stream after attention is (resid_pre + attn_out +
  laurel_out) / √2 (``hook_resid_mid``; the hook algebra's Gemma 3n rule). resid_mid + mlp_out = resid_post.
* **Per-layer inputs.** The model gives each token, per layer, a p-wide input ((its own per-layer embedding + a
  normed projection of its embedding) / √2): ``hook_per_layer_input`` (B,T,p). It gates the active corrected
  stream, act(W_gate·(s ⊙ stream)) ⊙ per_layer_input (s: ``correct_output_scale``, where ``altup_correct_scale``),
  which is projected back to d and normed: ``hook_per_layer_out`` (B,T,d), added to streams 1 .. n − 1 (not stream
  0). The correction and this write come after resid_post, so resid_post of one layer is not resid_pre of the next.
* **Attention** is Gemma 3's (QK-norm, sliding and full layers), through probe's attention function; a layer that
  reuses an earlier layer's keys and values (``num_kv_shared_layers``) hands those to it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformer_lens.hook_points import HookPoint

from probe.checkpoints.adapters.gemma import GemmaAdapter
from probe.checkpoints.hooked_hf import HookedHF, base_info


class AltUpHooks(nn.Module):
    """AltUp's coefficients of one layer (``blocks.{l}.altup``)."""

    def __init__(self):
        super().__init__()
        self.hook_predict = HookPoint()  # B,T,n,n out × in: prediction k = stream k + Σ_j c[k,j]·stream j
        self.hook_correct = HookPoint()  # B,T,n stream k after = prediction k + e_k·(resid_post − resid_pre)


def altup_predict(altup, hooks: AltUpHooks, streams: torch.Tensor) -> torch.Tensor:
    """``Gemma3nTextAltUp.predict`` (n,B,T,d -> n,B,T,d) in its own operations, its coefficients hooked."""
    config, n = altup.config, altup.config.altup_num_inputs
    modalities = altup.compute_router_modalities(streams[config.altup_active_idx])  # B,T,n
    if altup.training and config.altup_coef_clip is not None:  # as HF: the weights themselves are clipped
        altup.prediction_coefs.weight.data.clamp_(-config.altup_coef_clip, config.altup_coef_clip)
    coefs = hooks.hook_predict(altup.prediction_coefs(modalities).reshape(*modalities.shape[:-1], n, n))  # out × in
    mixed = torch.matmul(streams.permute(1, 2, 3, 0), coefs.permute(0, 1, 3, 2))  # B,T,d,n
    return (mixed.permute(3, 0, 1, 2) + streams).contiguous().type_as(streams)


def altup_correct(altup, hooks: AltUpHooks, predictions: torch.Tensor, activated: torch.Tensor) -> torch.Tensor:
    """``Gemma3nTextAltUp.correct`` (n,B,T,d and B,T,d -> n,B,T,d) in its own operations, its coefficients hooked."""
    config = altup.config
    modalities = altup.compute_router_modalities(activated)  # B,T,n
    weight = altup.correction_coefs.weight  # n,n
    if altup.training and config.altup_coef_clip is not None:
        weight = weight.clamp(-config.altup_coef_clip, config.altup_coef_clip)
    coefs = hooks.hook_correct(F.linear(modalities, weight) + 1.0)  # B,T,n
    innovation = activated - predictions[config.altup_active_idx]  # B,T,d
    corrected = innovation[None] * coefs.permute(2, 0, 1)[..., None] + predictions
    return corrected.contiguous().type_as(activated)


def altup_layer_forward(layer, hooks, hidden_states, position_embeddings=None, per_layer_input=None, **kwargs):
    """Gemma 3n's decoder layer (n,B,T,d -> n,B,T,d) with the stream, branch and residual hooks (module docstring)."""
    active = layer.config.altup_active_idx
    streams = hooks.hook_streams(hidden_states.permute(1, 2, 0, 3)).permute(2, 0, 1, 3)  # B,T,n,d seen
    predictions = altup_predict(layer.altup, hooks.altup, streams)
    predicted = predictions[active]
    resid = hooks.hook_resid_pre(predicted)
    if resid is not predicted:  # an edited resid_pre is the active prediction the correction starts from
        predictions = torch.stack([resid if k == active else p for k, p in enumerate(predictions)])
    normed = layer.input_layernorm(resid)
    laurel = hooks.hook_laurel_out(layer.laurel(normed))
    attn, _ = layer.self_attn(hidden_states=normed, position_embeddings=position_embeddings, **kwargs)
    attn_out = hooks.hook_attn_out(layer.post_attention_layernorm(attn))
    mid = hooks.hook_resid_mid((resid + attn_out + laurel) / math.sqrt(2))
    mlp_out = hooks.hook_mlp_out(layer.post_feedforward_layernorm(layer.mlp(layer.pre_feedforward_layernorm(mid))))
    out = hooks.hook_resid_post(mid + mlp_out)
    corrected = altup_correct(layer.altup, hooks.altup, predictions, out)
    first = corrected[active].clone()
    if layer.config.altup_correct_scale:
        first = layer.altup.scale_corrected_output(first)
    gated = layer.act_fn(layer.per_layer_input_gate(first)) * hooks.hook_per_layer_input(per_layer_input)  # B,T,p
    written = layer.post_per_layer_input_norm(layer.per_layer_projection(gated))  # B,T,d
    corrected[1:] += hooks.hook_per_layer_out(written)
    return hooks.hook_streams_post(corrected.permute(1, 2, 0, 3)).permute(2, 0, 1, 3)


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
            block.hook_streams, block.hook_streams_post = HookPoint(), HookPoint()  # B,T,n,d
            block.altup = AltUpHooks()
            block.hook_laurel_out, block.hook_per_layer_out = HookPoint(), HookPoint()  # B,T,d
            block.hook_per_layer_input = HookPoint()  # B,T,p
        super()._install(layers)
