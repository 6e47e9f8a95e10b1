"""Readable fp32 reference for causal attention with a phantom sink key and per-key logit biases.

    s_ij  = cap(scale * q_i . k_j) + key_bias_j       for visible j (j <= i and (i - window < j or j < keep): the
                                                      first ``keep`` keys stay past the window), or + mask_ij if given
    cap(x) = softcap * tanh(x / softcap)              Gemma 2's attention-logit soft-cap (softcap=None: cap(x) = x)
    lse_i = log(exp(sink_h) + sum_j exp(s_ij))
    a_ij  = exp(s_ij - lse_i)          phantom_i = exp(sink_h - lse_i)      sum_j a_ij + phantom_i = 1
    out_i = sum_j a_ij v_j             (the phantom's value is 0)

The cap bounds only the q.k score, as HF's Gemma 2 does before its mask; key_bias, the mask and the sink logit are
added uncapped (Gemma 2 has neither a key bias nor a sink, so this order is probe's choice for a model with both).

Materialises the (B, H, Tq, Tk) pattern: this is what tests compare against, what hooked forwards use, and what the
HF adapters' attention function uses when a pattern is asked for (``attention_probs``: one implementation of the
phantom key for custom models and checkpoints alike). Queries are the last Tq of the Tk positions (Tq < Tk: a cache).
"""

from __future__ import annotations

import math

import torch

from probe.kernels.common import wide  # fp32, or fp64 for fp64 inputs


def visible_mask(
    Tq: int, window: int | None, device=None, Tk: int | None = None, keep: int | None = None
) -> torch.Tensor:
    """(Tq, Tk) bool, True where key j is visible to query i (queries are the last Tq positions):
    j <= i' and (i' - window < j or j < keep) with i' = i + Tk - Tq (window=None: j <= i'). ``keep``: the kept-first-
    keys rule (StreamingLLM's window with its first keys kept, docs/definitions.md#window-eviction)."""
    Tk = Tq if Tk is None else Tk
    i = torch.arange(Tq, device=device)[:, None] + (Tk - Tq)
    j = torch.arange(Tk, device=device)[None, :]
    mask = j <= i
    if window is not None:
        mask &= (j > i - window) | (j < (keep or 0))
    return mask


def attention_probs(q, k, *, sink=None, key_bias=None, mask=None, window=None, scale=None, softcap=None, keep=None):
    """q (B,Tq,H,dh), k (B,Tk,Hkv,dh) -> (pattern (B,H,Tq,Tk), phantom (B,H,Tq), lse (B,H,Tq)), all fp32
    (fp64 for fp64 inputs).

    sink (H,): phantom logit per query head (None: no phantom). key_bias (B,Hkv,Tk): added to key j's logit.
    mask: additive logits broadcastable to (B,H,Tq,Tk) that replace the causal/window rule (HF's padding masks).
    keep: with a window, keys j < keep stay visible to every later query (visible_mask).
    A row that sees no key and no phantom (a knocked-out key's only query) gets zero mass and lse -inf, as the
    Triton kernel gives it, not NaN.
    softcap: scores become softcap * tanh(scores / softcap) before key_bias, mask and sink (None: no cap)."""
    scores = attention_scores(
        q, k, key_bias=key_bias, mask=mask, window=window, scale=scale, softcap=softcap, keep=keep
    )
    return probs_of_scores(scores, sink)


def attention_scores(q, k, *, key_bias=None, mask=None, window=None, scale=None, softcap=None, keep=None):
    """The pre-softmax scores (B,H,Tq,Tk) fp32 (fp64 for fp64 inputs) of :func:`attention_probs`: the capped
    scale * q.k, plus key_bias, with keys a row cannot see at -inf (or plus ``mask`` where one replaces the rule):
    what ``hook_attn_scores`` carries (docs/definitions.md#hook-namespace)."""
    Tq, H, dh = q.shape[1:]
    Tk, Hkv = k.shape[1], k.shape[2]
    G = H // Hkv  # query heads per kv head; head h reads kv head h // G
    scale = 1.0 / math.sqrt(dh) if scale is None else scale
    qf = wide(q).transpose(1, 2)  # (B, H, Tq, dh)
    kf = wide(k).transpose(1, 2).repeat_interleave(G, dim=1)  # (B, H, Tk, dh)
    # in place where autograd keeps nothing of the overwritten tensor (scalar products, sums): fewer Tq x Tk passes
    scores = (qf @ kf.transpose(-1, -2)).mul_(scale)  # (B, H, Tq, Tk)
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    if key_bias is not None:
        scores.add_(wide(key_bias).repeat_interleave(G, dim=1)[:, :, None, :])  # (B, H, 1, Tk) over keys
    if mask is None:
        return scores.masked_fill_(~visible_mask(Tq, window, q.device, Tk, keep), float("-inf"))
    return scores + wide(mask)


def probs_of_scores(scores, sink=None):
    """(pattern (B,H,Tq,Tk), phantom (B,H,Tq), lse (B,H,Tq)) of scores (B,H,Tq,Tk) and the phantom's logit per head
    (H,) or None: softmax over the real keys and the phantom, rows summing to 1 - phantom; lse over both."""
    B, H, Tq = scores.shape[:3]
    lse = scores.logsumexp(-1)  # (B, H, Tq)
    if sink is not None:
        sink_f = wide(sink)[None, :, None].expand(B, H, Tq)  # (B, H, Tq)
        lse = torch.logaddexp(lse, sink_f)
    lse_safe = lse.masked_fill(lse == float("-inf"), 0.0)  # an empty row: exp(-inf - 0) = 0, not NaN
    pattern = torch.exp(scores - lse_safe[..., None])  # rows sum to 1 - phantom
    phantom = torch.exp(sink_f - lse_safe) if sink is not None else torch.zeros_like(lse)
    return pattern, phantom, lse


def scores_of_probs(pattern, lse):
    """The scores an attention used, recovered from its pattern (B,H,Tq,Tk) and its lse over the real keys and the
    phantom (B,H,Tq): log a_ij + L_i (hidden keys -inf); where an armed edit made the op's pattern, the scores it
    took (docs/definitions.md#ablations)."""
    return torch.log(pattern) + lse.masked_fill(lse == float("-inf"), 0.0)[..., None]


def real_lse_blocked(
    q, k, *, key_bias=None, mask=None, window=None, scale=None, softcap=None, keep=None, block: int = 256
) -> torch.Tensor:
    """lse over the real keys (the phantom excluded), (B, H, Tq) fp32 (fp64 for fp64 inputs), in blocks of ``block``
    queries: each block's scores are block x (keys up to its last query; every key under a mask, which replaces the
    rule), never Tq x Tk. Same arguments and rule as attention_probs (queries the last Tq of the Tk positions); a row
    that sees no key gets -inf."""
    Tq, Tk = q.shape[1], k.shape[1]
    parts = []
    for a in range(0, Tq, block):
        b = min(Tq, a + block)
        n = Tk - Tq + b  # under the rule, queries a..b-1 are the last b - a of keys 0..n-1
        rows = None
        if mask is not None:  # the mask replaces the rule: every key; broadcast dims (size 1) stay as they are
            rows, n = (mask if mask.shape[-2] == 1 else mask[..., a:b, :]), Tk
        kw = dict(window=window, scale=scale, softcap=softcap, keep=keep)
        bias = None if key_bias is None else key_bias[..., :n]
        parts.append(attention_probs(q[:, a:b], k[:, :n], key_bias=bias, mask=rows, **kw)[2])
    return torch.cat(parts, -1)


def apply_pattern(pattern: torch.Tensor, v: torch.Tensor, dtype=None) -> torch.Tensor:
    """out (B,Tq,H,dv) = pattern (B,H,Tq,Tk) @ v (B,Tk,Hkv,dv), in fp32, GQA by repetition; cast to dtype (v's)."""
    G = pattern.shape[1] // v.shape[2]
    vf = wide(v).transpose(1, 2).repeat_interleave(G, dim=1)  # (B, H, Tk, dv)
    return (wide(pattern) @ vf).transpose(1, 2).to(dtype or v.dtype)


def pattern_norms(pattern: torch.Tensor, v: torch.Tensor, w_out: torch.Tensor) -> torch.Tensor:
    """The norm-weighted pattern (B,H,Tq,Tk) = ||a_ij f_h(v_j)||, f_h(v) = v W_O[h] the write key j's value makes
    through head h's slice of the output projection (Kobayashi et al. 2020;
    docs/definitions.md#norm-weighted-attention).

    pattern (B,H,Tq,Tk), v (B,Tk,Hkv,dv) the value aggregated (GQA by repetition), w_out (d, H*dv) the projection's
    weight as nn.Linear holds it; fp32 (fp64 for fp64 inputs). ||a f|| = |a| ||f||: one (B,Tk,H,d) product, as
    hook_result's, and no (Tq,Tk,d) tensor."""
    B, H = pattern.shape[:2]
    G = H // v.shape[2]
    vf = wide(v).repeat_interleave(G, dim=2)  # (B, Tk, H, dv)
    w = w_out.to(vf.dtype).view(w_out.shape[0], H, -1)  # (d, H, dv)
    f_norm = torch.einsum("bthe,dhe->bthd", vf, w).norm(dim=-1)  # (B, Tk, H) ||f_h(v_j)||
    return wide(pattern).abs() * f_norm.permute(0, 2, 1)[:, :, None, :]


def sink_attention_reference(
    q,
    k,
    v,
    *,
    sink=None,
    key_bias=None,
    mask=None,
    window=None,
    scale=None,
    softcap=None,
    keep=None,
    return_pattern=False,
):
    """q (B,Tq,H,dh), k (B,Tk,Hkv,dh), v (B,Tk,Hkv,dv) -> (out (B,Tq,H,dv) q.dtype, lse (B,H,Tq), pattern, phantom)."""
    pattern, phantom, lse = attention_probs(
        q, k, sink=sink, key_bias=key_bias, mask=mask, window=window, scale=scale, softcap=softcap, keep=keep
    )
    out = apply_pattern(pattern, v, q.dtype)
    if not return_pattern:
        return out, lse, None, None
    return out, lse, pattern, phantom
