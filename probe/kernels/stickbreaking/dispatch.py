"""``stickbreaking_attention``: causal GQA attention under stick-breaking rows
(docs/definitions.md#stick-breaking-attention), through probe.kernels.rule_attention.

    backend    path
    native     (default) fused.py's function with rows.c's C kernels (fp32 / fp64 CPU scores; else as torch)
    torch      fused.py: the rule as one autograd function with its backward written out
    compiled   fused.py's elementwise passes through torch.compile
    reference  reference.py: the rule through autograd, as readable as it gets

The authors' Triton kernels (``sb_attn``, ``sb_attn_varlen``) are not ported.
"""

from __future__ import annotations

from probe.kernels.rule_attention import rule_attention
from probe.kernels.sink_attention.dispatch import AttentionOutput
from probe.kernels.stickbreaking.fused import stickbreaking_of_scores_fused
from probe.kernels.stickbreaking.reference import stickbreaking_of_scores


def stickbreaking_attention(q, k, v, **kw) -> AttentionOutput:
    """q (B,Tq,H,dh), k (B,Tk,Hkv,dh), v (B,Tk,Hkv,dv) -> AttentionOutput(out (B,Tq,H,dv), lse None, pattern
    (B,H,Tq,Tk) and phantom (B,H,Tq) = 1 - row sums (the stick no key took) where return_pattern, lse_real None).
    ``kw``: rule_attention's key_bias, mask, window, scale, keep, return_pattern, edit, backend."""
    return rule_attention(
        q,
        k,
        v,
        name="stick-breaking",
        fused=stickbreaking_of_scores_fused,
        reference=stickbreaking_of_scores,
        at_most_one=True,
        native=True,
        **kw,
    )
