"""``softpick_attention``: causal GQA attention under softpick (docs/definitions.md#softpick), through
probe.kernels.rule_attention.

    backend    path
    native     (default) fused.py's function with rows.c's C kernels (fp32 / fp64 CPU scores; else as torch)
    torch      fused.py: the rule as one autograd function with its backward written out
    reference  reference.py: the rule through autograd, as readable as it gets
    triton     triton.py's online rule on probe.kernels.rule_triton's flash-style tiles (CUDA, or TRITON_INTERPRET=1)

The authors' fused FlashAttention-2 Triton kernel (``flash_softpick_attn.py``) is not ported: probe's own kernel
computes the reference's function (its shift, eps and the gradient through the shift).
"""

from __future__ import annotations

from functools import partial

from probe.kernels.rule_attention import TritonRule, rule_attention
from probe.kernels.sink_attention.dispatch import AttentionOutput
from probe.kernels.softpick.fused import softpick_of_scores_fused
from probe.kernels.softpick.reference import SOFTPICK_EPS, softpick_of_scores


def softpick_attention(q, k, v, *, eps: float = SOFTPICK_EPS, **kw) -> AttentionOutput:
    """q (B,Tq,H,dh), k (B,Tk,Hkv,dh), v (B,Tk,Hkv,dv) -> AttentionOutput(out (B,Tq,H,dv) in q.dtype, lse None,
    pattern (B,H,Tq,Tk) and phantom (B,H,Tq) = 1 - row sums where return_pattern, else None; lse_real None: softpick
    has no log-normaliser). ``kw``: rule_attention's key_bias, mask, window, scale, keep, return_pattern, edit,
    backend (softpick has no phantom key: no sink)."""
    return rule_attention(
        q,
        k,
        v,
        name="softpick",
        fused=partial(softpick_of_scores_fused, eps=eps),
        reference=partial(softpick_of_scores, eps=eps),
        at_most_one=True,
        triton=TritonRule("softpick", True, eps=eps),
        native=True,
        **kw,
    )
