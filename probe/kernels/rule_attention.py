"""``rule_attention``: causal GQA attention under a row rule that materialises its scores (softpick, the pointwise
rules, stick-breaking; probe.kernels.row_rules), the one body their ops share.

    backend    path
    torch      (default) the rule's fused autograd function (its backward written out)
    reference  the rule's plain PyTorch function, through autograd

Both take the (B, H, Tq, Tk) scores of sink attention's reference (fp32, fp64 for fp64 inputs: GQA, scale 1/sqrt(dh)
by default, key bias, mask or the causal / window rule) and give the same values. Attention edits (key-0 knockout,
window eviction) are sink attention's and are refused in one line.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from probe.kernels.common import check_attention_args
from probe.kernels.sink_attention.dispatch import AttentionOutput
from probe.kernels.sink_attention.reference import apply_pattern, attention_scores

BACKENDS = ("torch", "reference")
OfScores = Callable[[torch.Tensor], torch.Tensor]  # scores (B,H,Tq,Tk), hidden keys -inf -> weights (B,H,Tq,Tk)


def rule_attention(
    q,
    k,
    v,
    *,
    name: str,
    fused: OfScores,
    reference: OfScores,
    at_most_one: bool,
    key_bias=None,
    mask=None,
    window=None,
    scale=None,
    keep=None,
    return_pattern: bool = False,
    edit=None,
    backend: str = "torch",
) -> AttentionOutput:
    """q (B,Tq,H,dh), k (B,Tk,Hkv,dh), v (B,Tk,Hkv,dv) -> AttentionOutput(out (B,Tq,H,dv) in q.dtype, lse None,
    pattern (B,H,Tq,Tk) where return_pattern, phantom (B,H,Tq) = 1 - row sums where return_pattern and the rule's
    rows sum to at most one (else None), lse_real None: no log-normaliser). ``name`` is the rule's, for messages;
    the score arguments as sink_attention's, without a sink; backend one of BACKENDS."""
    if edit is not None:
        raise ValueError(f"attention edits (knockout, eviction) are not supported under {name} attention")
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not valid for {name} attention; choose one of {', '.join(BACKENDS)}")
    check_attention_args(q, k, v, None, key_bias, window, mask, keep)
    scores = attention_scores(q, k, key_bias=key_bias, mask=mask, window=window, scale=scale, keep=keep)
    pattern = (fused if backend == "torch" else reference)(scores)
    out = apply_pattern(pattern, v, q.dtype)
    if not return_pattern:
        return AttentionOutput(out, None, None, None)
    return AttentionOutput(out, None, pattern, 1.0 - pattern.sum(-1) if at_most_one else None)
