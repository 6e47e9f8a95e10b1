"""``pointwise_attention``: causal GQA attention under a pointwise rule (docs/definitions.md#pointwise-attention-rules),
through probe.kernels.rule_attention.

    backend    path
    torch      (default) fused.py: the rule as one autograd function with its backward written out
    reference  reference.py: the rule through autograd, as readable as it gets
    triton     triton.py's rule on probe.kernels.rule_triton's flash-style tiles (CUDA, or TRITON_INTERPRET=1)

Ramapuram et al.'s FlashSigmoid CUDA kernel is not ported.
"""

from __future__ import annotations

from functools import partial

from probe.kernels.pointwise.fused import pointwise_of_scores_fused
from probe.kernels.pointwise.reference import KERNELS, NORM_EPS, pointwise_of_scores
from probe.kernels.rule_attention import TritonRule, rule_attention
from probe.kernels.sink_attention.dispatch import AttentionOutput


def pointwise_attention(
    q, k, v, *, kernel: str, normalise: bool, bias: float = 0.0, eps: float = NORM_EPS, **kw
) -> AttentionOutput:
    """q (B,Tq,H,dh), k (B,Tk,Hkv,dh), v (B,Tk,Hkv,dv) -> AttentionOutput(out (B,Tq,H,dv) in q.dtype, lse None,
    pattern (B,H,Tq,Tk) where return_pattern, phantom (B,H,Tq) = 1 - row sums where return_pattern and the rule
    normalises (rows of an unnormalised rule sum to anything: phantom None), lse_real None). ``kernel`` one of KERNELS,
    ``bias`` the constant added to every score before the kernel; ``kw``: rule_attention's key_bias, mask, window,
    scale, keep, return_pattern, edit, backend ("torch", "reference", "triton")."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel={kernel!r} is not a pointwise attention kernel; choose one of {', '.join(KERNELS)}")
    return rule_attention(
        q,
        k,
        v,
        name=kernel,
        fused=partial(pointwise_of_scores_fused, kernel=kernel, normalise=normalise, bias=bias, eps=eps),
        reference=partial(pointwise_of_scores, kernel=kernel, normalise=normalise, bias=bias, eps=eps),
        at_most_one=normalise,
        triton=TritonRule(kernel, normalise, bias, eps),
        **kw,
    )
