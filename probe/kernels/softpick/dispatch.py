"""``softpick_attention``: causal GQA attention under softpick (docs/definitions.md#softpick).

    backend    path
    torch      (default) fused.py: the rule as one autograd function with its backward written out
    reference  reference.py: the rule through autograd, as readable as it gets

Both materialise the (B, H, Tq, Tk) scores in fp32 (fp64 for fp64 inputs) and give the same values. The authors'
fused FlashAttention-2 Triton kernel (``flash_softpick_attn.py``) is not ported.
Attention edits (key-0 knockout, window eviction) are sink attention's and are refused here in one line.
"""

from __future__ import annotations

from probe.kernels.common import check_attention_args
from probe.kernels.sink_attention.dispatch import AttentionOutput
from probe.kernels.sink_attention.reference import apply_pattern, attention_scores
from probe.kernels.softpick.fused import softpick_of_scores_fused
from probe.kernels.softpick.reference import SOFTPICK_EPS, softpick_attention_reference

BACKENDS = ("torch", "reference")


def softpick_attention(
    q,
    k,
    v,
    *,
    key_bias=None,
    mask=None,
    window=None,
    scale=None,
    keep=None,
    eps: float = SOFTPICK_EPS,
    return_pattern: bool = False,
    edit=None,
    backend: str = "torch",
) -> AttentionOutput:
    """q (B,Tq,H,dh), k (B,Tk,Hkv,dh), v (B,Tk,Hkv,dv) -> AttentionOutput(out (B,Tq,H,dv) in q.dtype, lse None,
    pattern (B,H,Tq,Tk) and phantom (B,H,Tq) = 1 - row sums where return_pattern, else None; lse_real None: softpick
    has no log-normaliser). Arguments as sink_attention's, without a sink (softpick has no phantom key); backend one of
    BACKENDS."""
    if edit is not None:
        raise ValueError("attention edits (knockout, eviction) are not supported under softpick attention")
    if backend not in BACKENDS:
        raise ValueError(
            f"backend={backend!r} is not valid for softpick attention; choose one of {', '.join(BACKENDS)}"
        )
    check_attention_args(q, k, v, None, key_bias, window, mask, keep)
    kw = dict(key_bias=key_bias, mask=mask, window=window, scale=scale, keep=keep)
    if backend == "reference":
        out, pattern, phantom = softpick_attention_reference(q, k, v, eps=eps, **kw)
    else:
        pattern = softpick_of_scores_fused(attention_scores(q, k, **kw), eps)
        out, phantom = apply_pattern(pattern, v, q.dtype), 1.0 - pattern.sum(-1)
    if not return_pattern:
        return AttentionOutput(out, None, None, None)
    return AttentionOutput(out, None, pattern, phantom)
