"""Row masses under a row rule other than softmax (probe.kernels.row_rules.ROW_RULES: softpick, sigmoid, the Gu et
al. kernels, any rule registered there), dispatched by the rule's name.

    a_ij         = rule.of_scores(s_i, bias)_j       s_ij as sink attention's scores (scale, soft-cap, key bias, mask)
    masses[.., c] = Σ_j a_ij indicators[b, j, h // G, c]
    total_i      = Σ_j a_ij                          the row's own mass (at most one where rule.at_most_one)

These rules have no log-normaliser to stream with, so the scores are made explicitly, one block of query rows at a
time over the keys those rows can see (block x (block + window) at most, never T x T), and the rule is applied to
each block's whole rows: a rule that is a function of a row's visible scores (what ``of_scores`` is) gives each row
exactly the weights ``hook_pattern`` carries. fp32, fp64 for fp64 inputs (the rules' own precision).
"""

from __future__ import annotations

import math

import torch

from probe.kernels.common import check_attention_args
from probe.kernels.row_rules import ROW_RULES
from probe.kernels.sink_attention.reference import attention_scores

ROW_BLOCK = 256  # query rows scored at once


def rule_row_masses(
    q,
    k,
    indicators,
    *,
    rule: str,
    bias: float = 0.0,
    key_bias=None,
    window=None,
    chunk=None,
    scale=None,
    softcap=None,
    block: int = ROW_BLOCK,
):
    """q (B,T,H,dh), k (B,T,Hkv,dh), indicators (B,T,Hkv,m) -> (total (B,H,T), masses (B,H,T,m)), fp32 (fp64 for
    fp64 inputs), the weights those of ``ROW_RULES[rule].of_scores`` with the constant logit bias ``bias``
    (``RowRule.bias(n_ctx)``: sigmoid's -log n_ctx). key_bias (B,Hkv,T), window, soft-cap and scale as
    ``attention_row_masses`` takes them; chunk: each chunk of ``chunk`` positions is a sequence of its own."""
    if rule not in ROW_RULES:
        raise ValueError(f"attention rule {rule!r} has no row masses here; choose one of {', '.join(ROW_RULES)}")
    check_attention_args(q, k, indicators, None, key_bias, window)
    if q.shape[1] != k.shape[1]:
        raise ValueError("rule_row_masses takes one sequence: as many queries as keys")
    if chunk is not None and int(chunk) < 1:
        raise ValueError(f"chunk must be a positive int or None, got {chunk!r}")
    of_scores = ROW_RULES[rule].of_scores
    totals, masses = [], []
    for s, ind in score_blocks(q, k, indicators, key_bias, window, chunk, scale, softcap, block):
        a = of_scores(s, bias=bias)  # (B, H, rows, keys)
        totals.append(a.sum(-1))
        masses.append(indicator_masses(a, ind))  # (B, H, rows, m)
    return torch.cat(totals, dim=-1), torch.cat(masses, dim=-2)


def score_blocks(q, k, indicators, key_bias, window, chunk, scale, softcap, block: int = ROW_BLOCK):
    """Yield (scores (B,H,rows,keys) with the rows' hidden keys -inf, indicators (B,Hkv,keys,m) in their dtype) for
    blocks of ``block`` query rows over the keys they can see (chunked attention: each chunk alone), in row order."""
    T = q.shape[1]
    span = T if chunk is None else int(chunk)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    kw = dict(window=None if window is None else int(window), scale=scale, softcap=softcap)
    for c0 in range(0, T, span):  # chunked attention: each chunk alone, its keys cut at its start
        for i0 in range(c0, min(T, c0 + span), block):
            i1 = min(T, c0 + span, i0 + block)
            j0 = c0 if window is None else max(c0, i0 - int(window) + 1)  # the first key these rows can see
            s = attention_scores(
                q[:, i0:i1],
                k[:, j0:i1],
                key_bias=None if key_bias is None else key_bias[..., j0:i1],
                **kw,
            )  # (B, H, rows, keys), the rows' hidden keys -inf
            yield s, indicators[:, j0:i1].to(s.dtype).permute(0, 2, 1, 3)  # (B, Hkv, keys, m)


def indicator_masses(a: torch.Tensor, ind: torch.Tensor) -> torch.Tensor:
    """Σ_j a_ij ind[h // G, j, c]: weights a (B,H,rows,keys), indicators (B,Hkv,keys,m) -> (B,H,rows,m)."""
    G = a.shape[1] // ind.shape[1]
    return (a.unflatten(1, (ind.shape[1], G)) @ ind[:, :, None]).flatten(1, 2)
