"""``stickbreaking_attention``: causal GQA attention under stick-breaking rows
(docs/definitions.md#stick-breaking-attention).

    backend    path
    torch      (default) fused.py: the rule as one autograd function with its backward written out
    reference  reference.py: the rule through autograd, as readable as it gets

Both materialise the (B, H, Tq, Tk) scores in fp32 (fp64 for fp64 inputs) and give the same values. The authors'
Triton kernels (``sb_attn``, ``sb_attn_varlen``) are not ported. Attention edits (key-0 knockout, window eviction) are
sink attention's and are refused here in one line.
"""

from __future__ import annotations

from probe.kernels.common import check_attention_args
from probe.kernels.sink_attention.dispatch import AttentionOutput
from probe.kernels.sink_attention.reference import apply_pattern, attention_scores
from probe.kernels.stickbreaking.fused import stickbreaking_of_scores_fused
from probe.kernels.stickbreaking.reference import stickbreaking_attention_reference

BACKENDS = ("torch", "reference")


def stickbreaking_attention(
    q,
    k,
    v,
    *,
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
    pattern (B,H,Tq,Tk) and phantom (B,H,Tq) = 1 - row sums (the stick left unbroken) where return_pattern, else
    None; lse_real None: no log-normaliser). Arguments as sink_attention's, without a sink; backend one of BACKENDS."""
    if edit is not None:
        raise ValueError("attention edits (knockout, eviction) are not supported under stick-breaking attention")
    if backend not in BACKENDS:
        raise ValueError(
            f"backend={backend!r} is not valid for stick-breaking attention; choose one of {', '.join(BACKENDS)}"
        )
    check_attention_args(q, k, v, None, key_bias, window, mask, keep)
    kw = dict(key_bias=key_bias, mask=mask, window=window, scale=scale, keep=keep)
    if backend == "reference":
        out, pattern = stickbreaking_attention_reference(q, k, v, **kw)
    else:
        pattern = stickbreaking_of_scores_fused(attention_scores(q, k, **kw))
        out = apply_pattern(pattern, v, q.dtype)
    if not return_pattern:
        return AttentionOutput(out, None, None, None)
    return AttentionOutput(out, None, pattern, 1.0 - pattern.sum(-1))
