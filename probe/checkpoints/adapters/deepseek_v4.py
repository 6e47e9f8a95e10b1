"""DeepSeek-V4 adapter: a residual of N hyper-connected streams (mHC), sliding-window attention with a learned sink per
head, and compressed KV entries read as extra keys after the token keys (docs/definitions.md#compressed-keys).

What transformers' ``modeling_deepseek_v4.py`` computes, and what the hooks see of it:

* **Streams.** The embedding is copied into ``hc_mult`` = N streams (B,T,N,d). Each layer has two hyper-connections
  (``attn_hc`` before attention, ``ffn_hc`` before the MoE): from the streams (flattened, RMS-normed, one linear map)
  come ``pre`` (B,T,N) = σ(·) + eps, ``post`` (B,T,N) = 2σ(·) and ``res`` (B,T,N,N), a softmax made (nearly) doubly
  stochastic by Sinkhorn iterations. The sub-layer reads Σ_k pre_k·stream_k; the streams become
  stream_k ← Σ_j res[j,k]·stream_j + post_k·out (HF's ``res``, in × out). After the last layer ``hc_head`` collapses
  them with weights of its own before the final norm. Hooks: ``hook_streams`` / ``hook_streams_mid`` (B,T,N,d),
  ``hc_attn`` / ``hc_mlp`` ``.hook_pre`` / ``hook_post`` / ``hook_res`` (out × in, HF's ``res`` transposed, as the
  vocabulary states it) and ``.hook_read`` (the sub-layer's input); ``hook_resid_pre`` / ``mid`` / ``post`` are the
  stream sums, as on probe's own hyper-connected models (an edit of one adds its change, divided by N, to every
  stream, so the sum moves by exactly the edit), and ``hook_attn_out`` / ``hook_mlp_out`` the sub-layers' outputs
  before ``post`` spreads them; ``hc_head.hook_pre`` (B,T,N) is the head's collapse weights, as on probe's own
  hyper-connected models, so the final read is Σ_k hook_pre_k·stream_k. The residual algebra therefore holds as the
  stream rules of ``probe.checkpoints.algebra`` (resid_pre + attn_out = resid_mid does not: the mix rescales both
  terms).
* **Attention.** Every layer, whatever its ``layer_types`` entry, masks its token keys with one sliding window of
  ``sliding_window`` keys (the model builds a single sliding-window mask), shares one key head as keys and values
  (rotary included on the trailing ``qk_rope_head_dim`` coordinates, interleaved pairs; the output's rotary slice is
  turned back at the query's position before the grouped output projection), and adds a learned sink logit per
  head (``hook_sink_logit``, as gpt-oss). hook_q is ``q_b_proj``'s output, hook_q_normed its unweighted RMS norm;
  hook_k is ``kv_proj``'s output (the one head read as key and value), hook_k_normed ``kv_norm``'s, so an edit of
  hook_k or hook_k_normed changes the values too; hook_result and hook_pattern_norm are absent (the grouped output
  projection reads the heads after their rotary slice is turned back).
* **Compressed KV.** ``compressed_sparse_attention`` (CSA) and ``heavily_compressed_attention`` layers also run a
  compressor: each closed window of ``compress_rates[type]`` tokens (4 and 128 by default) becomes one KV
  entry (a softmax-gated sum of projected tokens, RMS-normed, rotated at its window's first position; CSA windows
  overlap by one window and a Lightning Indexer keeps the ``index_topk`` best entries per query), appended after the
  token keys, visible to a query once its window has closed. A forward hook on the compressor fires
  ``hook_compressed_kv`` (B,C,1,dh) and leaves the entries' visibility (HF's block bias) for the attention call,
  which reads them as extra keys after the tokens' (probe.checkpoints.attention.split_extra_keys): hook_pattern is
  B,H,T,T+C, the describe step states each layer's rate and top-k (``extra["compress_rates"]`` /
  ``extra["compress_topk"]``, read by ``LayerAttention``; docs/definitions.md#compressed-keys).
* **MoE.** A shared expert plus routed experts; the first ``hash_moe`` layers pick experts by a fixed token-id table
  (``tid2eid``), the others by top-k of the router's scores: ``mlp.hook_router_logits`` / ``hook_expert_indices`` /
  ``hook_expert_weights`` where ``probe.checkpoints.module_hooks`` can re-run the router alone.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn
from transformer_lens.hook_points import HookPoint

from probe.checkpoints.adapters.llama import SEQUENTIAL
from probe.checkpoints.adapters.recipes import RecipeAdapter
from probe.checkpoints.hooked_hf import _hook_once
from probe.hooks.fire import fire
from probe.models.depth_mechanisms.hyper_connections import sinkhorn
from probe.models.hyper import through_sum

COMPRESSOR_KEY = "_probe_compressor"  # compressor module.__dict__ entry -> the layer's attention hooks
HEAD_KEY = "_probe_hc_head"  # hc_head module.__dict__ entry -> the adapter's HeadHooks


class HCHooks(nn.Module):
    """One hyper-connection's weights (``blocks.{l}.hc_attn`` / ``hc_mlp``)."""

    def __init__(self):
        super().__init__()
        self.hook_pre = HookPoint()  # B,T,N
        self.hook_post = HookPoint()  # B,T,N
        self.hook_res = HookPoint()  # B,T,N,N
        self.hook_read = HookPoint()  # B,T,d the sub-layer's input Σ_k pre_k·stream_k


class HeadHooks(nn.Module):
    """The final collapse's weights (``hc_head.hook_pre``)."""

    def __init__(self):
        super().__init__()
        self.hook_pre = HookPoint()  # B,T,N


def hooked_head_forward(head: nn.Module, streams: torch.Tensor) -> torch.Tensor:
    """``DeepseekV4HyperHead.forward`` (B,T,N,d -> B,T,d) in its order of operations, its weights pre (B,T,N, fp32)
    through ``hook_pre``."""
    flat = head.input_norm(streams.flatten(2).float())
    mixes = F.linear(flat, head.hc_fn.float())
    pre = torch.sigmoid(mixes * head.hc_scale.float() + head.hc_base.float()) + head.eps
    pre = head.__dict__[HEAD_KEY].hook_pre(pre)
    return (pre.unsqueeze(-1) * streams).sum(dim=2).to(streams.dtype)


def hc_weights(hc: nn.Module, streams: torch.Tensor):
    """(pre B,T,N, post B,T,N, res B,T,N,N out × in: HF's comb transposed, Sinkhorn by the mHC mechanism's own
    ``sinkhorn``) of a ``DeepseekV4HyperConnection`` on streams B,T,N,d, in fp32 as its forward computes them (its
    forward consumes ``pre`` itself, so the weights are computed here to be hooked)."""
    b, t, n = streams.shape[:3]
    flat = F.linear(hc.input_norm(streams.reshape(b, t, -1).float()), hc.fn.float())
    pre_w, post_w, res_w = flat.split([n, n, n * n], dim=-1)
    pre_b, post_b, res_b = hc.base.split([n, n, n * n])
    pre_s, post_s, res_s = hc.scale.unbind(0)
    pre = torch.sigmoid(pre_w * pre_s + pre_b) + hc.hc_eps
    post = 2 * torch.sigmoid(post_w * post_s + post_b)
    res = sinkhorn(res_w.view(b, t, n, n) * res_s + res_b.view(n, n), hc.hc_sinkhorn_iters, hc.hc_eps)  # out × in
    return pre, post, res


def connect(hc: nn.Module, points: HCHooks, streams: torch.Tensor):
    """The sub-layer's input Σ_k pre_k·stream_k (B,T,d) and the (post, res) that spread its output, through the
    connection's hook points."""
    pre, post, res = hc_weights(hc, streams)
    pre, post, res = points.hook_pre(pre), points.hook_post(post), points.hook_res(res)  # res out × in
    return points.hook_read((pre.unsqueeze(-1) * streams).sum(dim=2).to(streams.dtype)), post, res


def spread(out: torch.Tensor, post: torch.Tensor, res: torch.Tensor, streams: torch.Tensor) -> torch.Tensor:
    """stream_k ← Σ_j res[k,j]·stream_j + post_k·out (B,T,N,d; res out × in), in HF's order of operations."""
    dtype = streams.dtype
    return post.to(dtype).unsqueeze(-1) * out.unsqueeze(-2) + torch.matmul(res.to(dtype), streams)


def hc_layer_forward(layer, hooks, hidden_states, input_ids=None, **kwargs):
    """DeepSeek-V4's decoder layer (B,T,N,d -> B,T,N,d) with the stream, connection and residual hooks."""
    streams = through_sum(hooks.hook_resid_pre, hooks.hook_streams(hidden_states))
    x, post, res = connect(layer.attn_hc, hooks.hc_attn, streams)
    attn_out = hooks.hook_attn_out(layer.self_attn(layer.input_layernorm(x), **kwargs)[0])
    streams = through_sum(hooks.hook_resid_mid, hooks.hook_streams_mid(spread(attn_out, post, res, streams)))
    x, post, res = connect(layer.ffn_hc, hooks.hc_mlp, streams)
    mlp_out = hooks.hook_mlp_out(layer.mlp(layer.post_attention_layernorm(x), input_ids=input_ids))
    return through_sum(hooks.hook_resid_post, spread(mlp_out, post, res, streams))


def pass_compressed_entries(module, _inputs, output):
    """Forward hook on a layer's compressor (output: entries B,1,C,dh and their visibility, an additive bias
    B,1,T,C or None): the entries through ``hook_compressed_kv`` (B,C,1,dh; an edit changes the keys and values the
    attention appends), the bias left on the layer's attention hooks for the attention call that follows
    (probe.checkpoints.attention.split_extra_keys). A single query (decoding) sees every entry: HF passes no bias."""
    site = module.__dict__[COMPRESSOR_KEY]
    entries, bias = output
    seen = entries.transpose(1, 2)  # B,C,1,dh: positions (here entries) second, as every attention point
    fired, edited = fire(site.hook_compressed_kv, seen)
    if bias is None:
        bias = entries.new_zeros((entries.shape[0], 1, 1, entries.shape[2]))
    site.pending_keys = bias
    return (fired.transpose(1, 2), bias) if edited else None


class DeepseekV4Adapter(RecipeAdapter):
    family = "deepseek_v4"
    model_types = ("deepseek_v4",)
    recipe = SEQUENTIAL  # the norms' names (ln1 / ln2); the layer is hc_layer_forward
    layer_forward = staticmethod(hc_layer_forward)

    def describe(self, config, name):
        info = super().describe(config, name)
        text = config.get_text_config()
        info.layer_types = ["sliding"] * info.n_layers  # one sliding-window mask for every layer's token keys
        info.sliding_window = text.sliding_window
        rates = [text.compress_rates.get(t) for t in text.layer_types[: info.n_layers]]  # None: sliding only
        topk = [text.index_topk if t == "compressed_sparse_attention" else None for t in text.layer_types]
        info.extra.update(
            hc_streams=text.hc_mult,
            n_experts=text.n_routed_experts,
            experts_per_token=text.num_experts_per_tok,
            compress_rates=rates,
            compress_topk=topk[: info.n_layers],
        )
        return info

    def _install(self, layers):
        self.hc_head = HeadHooks()
        head = self.hf_model.base_model.hc_head
        head.__dict__[HEAD_KEY] = self.hc_head  # an adapter built again on the same model re-points it
        head.forward = types.MethodType(hooked_head_forward, head)
        for block, layer in zip(self.blocks, layers):
            block.hook_streams, block.hook_streams_mid = HookPoint(), HookPoint()  # B,T,N,d
            block.hc_attn, block.hc_mlp = HCHooks(), HCHooks()
            if self.attention_module(layer).compressor is not None:
                block.attn.hook_compressed_kv = HookPoint()  # B,C,1,dh
        super()._install(layers)
        for layer, block in zip(layers, self.blocks):
            compressor = self.attention_module(layer).compressor
            if compressor is not None:
                _hook_once(compressor, COMPRESSOR_KEY, block.attn, pass_compressed_entries)
