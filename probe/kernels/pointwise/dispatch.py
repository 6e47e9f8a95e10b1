"""``pointwise_attention``: causal GQA attention under a pointwise rule (docs/definitions.md#pointwise-attention-rules).

    backend    path
    torch      (default) fused.py: the rule as one autograd function with its backward written out
    reference  reference.py: the rule through autograd, as readable as it gets

Both materialise the (B, H, Tq, Tk) scores in fp32 (fp64 for fp64 inputs) and give the same values. Ramapuram et al.'s
FlashSigmoid CUDA kernel is not ported. Attention edits (key-0 knockout, window eviction) are sink attention's and are
refused here in one line.
"""

from __future__ import annotations

from probe.kernels.common import check_attention_args
from probe.kernels.pointwise.fused import pointwise_of_scores_fused
from probe.kernels.pointwise.reference import KERNELS, NORM_EPS, pointwise_attention_reference
from probe.kernels.sink_attention.dispatch import AttentionOutput
from probe.kernels.sink_attention.reference import apply_pattern, attention_scores

BACKENDS = ("torch", "reference")


def pointwise_attention(
    q,
    k,
    v,
    *,
    kernel: str,
    normalise: bool,
    bias: float = 0.0,
    eps: float = NORM_EPS,
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
    pattern (B,H,Tq,Tk) where return_pattern, phantom (B,H,Tq) = 1 - row sums where return_pattern and the rule
    normalises (rows of an unnormalised rule sum to anything: phantom None), lse_real None). ``kernel`` one of KERNELS,
    ``bias`` the constant added to every score before the kernel; the rest as sink_attention's, without a sink."""
    if edit is not None:
        raise ValueError(f"attention edits (knockout, eviction) are not supported under {kernel} attention")
    if backend not in BACKENDS:
        raise ValueError(
            f"backend={backend!r} is not valid for {kernel} attention; choose one of {', '.join(BACKENDS)}"
        )
    if kernel not in KERNELS:
        raise ValueError(f"kernel={kernel!r} is not a pointwise attention kernel; choose one of {', '.join(KERNELS)}")
    check_attention_args(q, k, v, None, key_bias, window, mask, keep)
    kw = dict(key_bias=key_bias, mask=mask, window=window, scale=scale, keep=keep)
    if backend == "reference":
        out, pattern = pointwise_attention_reference(
            q, k, v, kernel=kernel, normalise=normalise, bias=bias, eps=eps, **kw
        )
    else:
        pattern = pointwise_of_scores_fused(attention_scores(q, k, **kw), kernel, normalise, bias, eps)
        out = apply_pattern(pattern, v, q.dtype)
    if not return_pattern:
        return AttentionOutput(out, None, None, None)
    return AttentionOutput(out, None, pattern, 1.0 - pattern.sum(-1) if normalise else None)
