"""DiffLlama adapter: Llama's layer with differential attention, DIFF V1 (docs/definitions.md#differential-attention).

What transformers' ``modeling_diffllama.py`` computes, and what the hooks see of it:

* **Heads.** ``num_attention_heads`` = 2H query heads of ``head_dim``: the first H are the branch-1 queries of the H
  differential heads, the last H their branch-2 queries, and the KV heads the same way (2Hkv). That is probe's
  branch-major layout (probe.kernels.diff_attention), so ``hook_q`` / ``hook_rot_q`` (B,T,2H,dh) and ``hook_k`` /
  ``hook_rot_k`` (B,T,2Hkv,dh) are HF's projections as they are. ``probe_info`` counts the H differential heads
  (n_heads = H, n_kv_heads = Hkv), as a probe model with ``attn_fn="diff"`` does.
* **Values.** HF splits the KV heads' values in two halves and runs two attention calls; differential KV head g reads
  the value [v_g, v_{Hkv+g}] (2·dh wide): ``hook_v`` / ``hook_v_out`` are (B,T,Hkv,2dh) in that order.
* **Rows.** λ = exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + λ_init (one per layer, the exponents in fp32 as HF takes them)
  repeated over the H heads at ``hook_lambda``; ``hook_pattern_1`` / ``hook_pattern_2`` the branches' softmax rows,
  ``hook_pattern`` the signed net rows p1 − λ p2 (B,H,T,T), ``hook_attn_scores`` both branches' scores (B,2H,T,T).
* **Output.** Each head's Σ_j a_ij v_j is RMS-normed over its 2·dh without a gain (``groupnorm``, eps
  ``rms_norm_eps``) and scaled by (1 − λ_init): that is ``hook_z`` (B,T,H,2dh), read by ``o_proj``.
  ``hook_lse``, ``hook_phantom`` and ``hook_pattern_norm`` do not fire (signed rows; the norm is not linear).
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from transformer_lens.hook_points import HookPoint

from probe.checkpoints.adapters.llama import SEQUENTIAL
from probe.checkpoints.adapters.recipes import RecipeAdapter
from probe.checkpoints.attention import SITE_KEY, _hf_wants_attentions, as_rules, refuse_unknown, spread_hidden_rows
from probe.checkpoints.hooked_hf import INSTANCE_FORWARDS
from probe.hooks import names
from probe.hooks.fire import fire
from probe.kernels.diff_attention import diff_attention, net_pattern, patterns_of_scores
from probe.kernels.sink_attention.reference import apply_pattern, attention_scores

SIGNED_ABSENT = ("lse", "phantom", "pattern_norm")  # what signed rows never fire (probe's diff models alike)


class DiffFinish:
    """The per-head output step after the rows (what the hook algebra re-applies to Σ_j a_ij v_j): HF's gainless
    RMS norm over each head's 2·dh and the (1 − λ_init) scale. A plain attribute of the site, not a submodule."""

    def __init__(self, attn):
        self.attn = attn

    def finish(self, mixed: torch.Tensor) -> torch.Tensor:  # B,T,H,2dh -> B,T,H,2dh
        return (1 - self.attn.lambda_init) * self.attn.groupnorm(mixed)


def layer_lambda(attn, heads: int, dtype) -> torch.Tensor:
    """λ (H,) of a DiffLlama layer, HF's one scalar repeated per head: its exponents in fp32, cast to ``dtype``."""
    lam_1 = torch.exp(torch.sum(attn.lambda_q1 * attn.lambda_k1, dim=-1, dtype=torch.float32)).to(dtype)
    lam_2 = torch.exp(torch.sum(attn.lambda_q2 * attn.lambda_k2, dim=-1, dtype=torch.float32)).to(dtype)
    return (lam_1 - lam_2 + attn.lambda_init).expand(heads)


def _projected(attn, site, hidden, position_embeddings, cache, kwargs):
    """(q B,T,2H,dh, k B,Tk,2Hkv,dh, v B,Tk,Hkv,2dh) through hook_q / hook_k / hook_rot_q / hook_rot_k / hook_v /
    hook_v_out, HF's rotary (and cache update) in between. The projections are read by their weights here (their
    module hooks, which view the output as H heads, do not fire)."""
    from transformers.models.diffllama.modeling_diffllama import apply_rotary_pos_emb

    B, T, dh = hidden.shape[0], hidden.shape[1], attn.head_dim
    q = site.hook_q(F.linear(hidden, attn.q_proj.weight, attn.q_proj.bias).view(B, T, -1, dh))
    k = site.hook_k(F.linear(hidden, attn.k_proj.weight, attn.k_proj.bias).view(B, T, -1, dh))
    v = attn.v_proj(hidden).view(B, T, -1, dh)  # B,T,2Hkv,dh
    cos, sin = position_embeddings
    q, k = apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin)  # B,heads,T,dh
    v = v.transpose(1, 2)
    if cache is not None:
        k, v = cache.update(k, v, attn.layer_idx, kwargs=kwargs)
    q, k = site.hook_rot_q(q.transpose(1, 2)), site.hook_rot_k(k.transpose(1, 2))
    v = torch.cat(v.transpose(1, 2).chunk(2, dim=2), dim=-1)  # B,Tk,Hkv,2dh: head g reads [v_g, v_{Hkv+g}]
    return q, k, site.hook_v_out(site.hook_v(v))


def _rows(site, q, k, v, lam, scale: float, mask):
    """Σ_j a_ij v_j (B,T,H,2dh) from materialised rows, with hook_attn_scores, hook_pattern_1 / _2 and hook_pattern
    (an edit of the scores or a branch re-makes the net rows; an edit of the net rows re-makes the output)."""
    scores = site.hook_attn_scores(attention_scores(q, k, mask=mask, scale=scale))  # B,2H,Tq,Tk
    p1, p2 = patterns_of_scores(scores)
    if mask is not None:  # a pad query's row (every key hidden): even, as transformers' softmax gives it
        H = p1.shape[1]
        p1, p2 = spread_hidden_rows(scores[:, :H], p1), spread_hidden_rows(scores[:, H:], p2)
    net = net_pattern(site.hook_pattern_1(p1), site.hook_pattern_2(p2), lam)
    return apply_pattern(site.hook_pattern(net), v, q.dtype)


def _wants_rows(site) -> bool:
    """Materialise the rows? When a hook or cache reads them or the scores, the adapter materialises, or HF was asked
    for the attentions."""
    points = (site.hook_attn_scores, site.hook_pattern_1, site.hook_pattern_2, site.hook_pattern)
    return site.materialize or any(p.has_hooks() for p in points) or _hf_wants_attentions()


def diffllama_attention(attn, hidden_states, position_embeddings, attention_mask=None, cache=None, **kwargs):
    """HF's ``DiffLlamaAttention.forward`` with the hooks, installed as the module's instance forward: (output B,T,d,
    None)."""
    site = attn.__dict__[SITE_KEY]
    cache = cache if cache is not None else kwargs.pop("past_key_values", None)
    refuse_unknown(attn, kwargs)
    q, k, v = _projected(attn, site, hidden_states, position_embeddings, cache, kwargs)
    H = q.shape[2] // 2
    lam = site.hook_lambda(layer_lambda(attn, H, q.dtype))  # H
    rules, mask = as_rules(attention_mask, None, q.shape[1], k.shape[1], q.device)
    if rules is not None and (rules.keep is not None or rules.window is not None):  # padding: a dense mask's rows
        rules, mask = None, rules.dense(slice(None), q.shape[1], k.shape[1], q.dtype, q.device)
    if _wants_rows(site) or mask is not None:
        out = _rows(site, q, k, v, lam, attn.scaling, mask)
    else:  # causal, nothing hooked: the fused op, nothing T x T stored
        out = diff_attention(q, k, v, lam, scale=attn.scaling).out
    z = site.hook_z(site.diff.finish(out))  # B,T,H,2dh
    return _project_out(attn, site, z), None


def _project_out(attn, site, z):
    """o_proj of the heads side by side (B,T,d); hook_result (B,T,H,d) where hooked, an edit summed back."""
    B, T, H = z.shape[:3]
    out = F.linear(z.reshape(B, T, -1), attn.o_proj.weight, attn.o_proj.bias)
    if not (site.materialize or site.hook_result.has_hooks()):
        return out
    w = attn.o_proj.weight.view(-1, H, z.shape[-1])  # d, H, 2dh
    result = torch.einsum("bthe,dhe->bthd", z, w)
    fired, edited = fire(site.hook_result, result)
    if not edited:
        return out
    return fired.sum(2) if attn.o_proj.bias is None else fired.sum(2) + attn.o_proj.bias


class DiffLlamaAdapter(RecipeAdapter):
    family = "diffllama"
    model_types = ("diffllama",)
    recipe = SEQUENTIAL

    def describe(self, config, name):
        info = super().describe(config, name)
        text = config.get_text_config()
        info.n_heads, info.n_kv_heads = text.num_attention_heads // 2, text.num_key_value_heads // 2
        info.attention_rule = "diff"
        info.extra["attn_scale"] = info.d_head**-0.5
        below_block = [names.attn(0, p).split(".", 2)[-1] for p in SIGNED_ABSENT]
        info.absent_hooks += [p for p in below_block if p not in info.absent_hooks]
        return info

    def _install(self, layers):
        for block, layer in zip(self.blocks, layers):
            block.attn.hook_pattern_1 = HookPoint()  # B,H,Tq,Tk branch 1's softmax rows
            block.attn.hook_pattern_2 = HookPoint()  # B,H,Tq,Tk branch 2's
            block.attn.hook_lambda = HookPoint()  # H
            block.attn.__dict__["diff"] = DiffFinish(self.attention_module(layer))
        super()._install(layers)
        for block in self.blocks:  # signed rows: no phantom, no lse, no pattern norm (the points are not created)
            for point in SIGNED_ABSENT:
                if hasattr(block.attn, f"hook_{point}"):
                    delattr(block.attn, f"hook_{point}")
        for layer in layers:  # the attention module runs diffllama_attention: one call, the hooks inside
            attn = self.attention_module(layer)
            attn.forward = types.MethodType(diffllama_attention, attn)


INSTANCE_FORWARDS.add(diffllama_attention)
