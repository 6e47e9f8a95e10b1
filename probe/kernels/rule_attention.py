"""``rule_attention``: causal GQA attention under a row rule that materialises its scores (softpick, the pointwise
rules, stick-breaking; probe.kernels.row_rules), the one body their ops share.

    backend    path
    native     (what "auto" picks) the same function with its forward and backward as the rule's C kernels
               (probe.kernels.native: softpick, stick-breaking; fp32 / fp64 CPU scores, where they build), each row's
               passes run while the row is in cache; rules without C kernels, and other tensors, take the torch path
    torch      the rule's fused autograd function (its backward written out)
    compiled   the same function with its forward and backward compiled by torch.compile (probe.kernels.compiled;
               Inductor's C++ on CPU): the same values up to summation order, a few passes over each block of scores
               where the eager ops make a dozen
    reference  the rule's plain PyTorch function, through autograd
    triton     probe.kernels.rule_triton, flash-style, for the rules that have a ``TritonRule`` (the pointwise rules,
               softpick): CUDA tensors, or CPU tensors under TRITON_INTERPRET=1; no pattern, mask, cache or kept
               first keys. When no launch setting fits the device it runs the torch path, with one warning per shape

``backend=None`` (the default) is the runtime choice (probe.kernels.backend) as these ops read it: "compiled" runs
compiled, "auto" native, every other choice the torch path, as before the runtime choice existed for them (the
Triton rule kernels have not run on a GPU yet, so "auto" and "triton" do not pick them).

Causal rows without a mask, a window or a pattern to return run in blocks of ``QUERY_BLOCK`` queries, each over the keys
up to its last query only: the keys past it are hidden (weight 0 under every rule here, and no term in its row sums),
so the masked upper triangle is never built, and the T x T passes (scores, rule, its backward, the value product)
shrink to about (1 + 1/n_blocks) / 2 of the square. The values are the unblocked ones up to summation order. The
torch backend runs the blocks as one autograd function (probe.kernels.causal_blocks: gradients added in place, no
slice or concatenation nodes); the reference backend through plain autograd.

The torch paths take the (B, H, Tq, Tk) scores of sink attention's reference (fp32, fp64 for fp64 inputs: GQA,
scale 1/sqrt(dh) by default, key bias, mask or the causal / window rule), and all three give the same values.
Attention edits (key-0 knockout, window eviction) are sink attention's and are refused in one line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from probe.kernels.backend import check_triton, current_backend
from probe.kernels.causal_blocks import causal_blocks
from probe.kernels.common import check_attention_args
from probe.kernels.launch import NoLaunchConfig, warn_fallback
from probe.kernels.sink_attention.dispatch import AttentionOutput
from probe.kernels.sink_attention.reference import apply_pattern, attention_scores

BACKENDS = ("native", "torch", "compiled", "reference", "triton")
QUERY_BLOCK = 64  # queries per block of the causal path: at T = 256, 4 blocks cover 10/16 of the square
OfScores = Callable[[torch.Tensor], torch.Tensor]  # scores (B,H,Tq,Tk), hidden keys -inf -> weights (B,H,Tq,Tk)


@dataclass(frozen=True)
class TritonRule:
    """What the Triton kernels (probe.kernels.rule_triton) take of a rule: its kernel, whether rows are normalised,
    the constant logit bias and the denominator's eps."""

    rule: str  # a key of rule_triton.RULE_IDS: "sigmoid", "elu1", "softpick"
    normalise: bool
    bias: float = 0.0
    eps: float = 0.0


def rule_attention(
    q,
    k,
    v,
    *,
    name: str,
    fused: Callable[..., torch.Tensor],
    reference: OfScores,
    at_most_one: bool,
    key_bias=None,
    mask=None,
    window=None,
    scale=None,
    keep=None,
    return_pattern: bool = False,
    edit=None,
    backend: str | None = None,
    triton: TritonRule | None = None,
    native: bool = False,
) -> AttentionOutput:
    """q (B,Tq,H,dh), k (B,Tk,Hkv,dh), v (B,Tk,Hkv,dv) -> AttentionOutput(out (B,Tq,H,dv) in q.dtype, lse None,
    pattern (B,H,Tq,Tk) where return_pattern, phantom (B,H,Tq) = 1 - row sums where return_pattern and the rule's
    rows sum to at most one (else None), lse_real None: no log-normaliser). ``name`` is the rule's, for messages;
    the score arguments as sink_attention's, without a sink; ``fused`` takes ``compiled=`` (and ``native=`` where
    ``native``: the rule has C kernels); backend one of BACKENDS (triton: the rule's ``triton``)."""
    if edit is not None:
        raise ValueError(f"attention edits (knockout, eviction) are not supported under {name} attention")
    if backend is None:  # the runtime choice: "compiled" and "auto" (native) are the ones these ops take from it
        backend = {"compiled": "compiled", "auto": "native"}.get(current_backend(), "torch")
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not valid for {name} attention; choose one of {', '.join(BACKENDS)}")
    check_attention_args(q, k, v, None, key_bias, window, mask, keep)
    if backend == "triton":
        out = _triton_out(q, k, v, name, triton, key_bias, mask, window, scale, keep, return_pattern)
        if out is not None:
            return AttentionOutput(out, None, None, None)
        backend = "torch"  # no launch fits the device (warned once)
    paths = dict(compiled=backend == "compiled", **(dict(native=backend == "native") if native else {}))
    of_scores = reference if backend == "reference" else partial(fused, **paths)
    if mask is None and window is None and keep is None and not return_pattern:
        if backend != "reference":  # one autograd function over the blocks (probe.kernels.causal_blocks)
            out = causal_blocks(q, k, v, of_scores, key_bias=key_bias, scale=scale, block=QUERY_BLOCK)
        else:
            out = _causal_blocks(q, k, v, of_scores, key_bias, scale)
        return AttentionOutput(out, None, None, None)
    scores = attention_scores(q, k, key_bias=key_bias, mask=mask, window=window, scale=scale, keep=keep)
    pattern = of_scores(scores)
    out = apply_pattern(pattern, v, q.dtype)
    if not return_pattern:
        return AttentionOutput(out, None, None, None)
    return AttentionOutput(out, None, pattern, 1.0 - pattern.sum(-1) if at_most_one else None)


def _triton_out(q, k, v, name, triton, key_bias, mask, window, scale, keep, return_pattern) -> torch.Tensor | None:
    """out (B,T,H,dv) of the Triton kernels, or None where no launch setting fits the device; raises, in one line,
    on a call they do not take."""
    if triton is None:
        choices = "native, torch, compiled, reference"
        raise ValueError(f"backend='triton' has no kernel for {name} attention; choose one of {choices}")
    if return_pattern or mask is not None or keep is not None or q.shape[1] != k.shape[1]:
        raise ValueError(
            f"backend='triton' runs {name} attention over one sequence without a pattern: no return_pattern, mask, "
            "keep or cache (Tq == Tk); use 'native', 'torch', 'compiled' or 'reference'"
        )
    check_triton(q.device)
    from probe.kernels.rule_triton import rule_attention_triton

    try:
        return rule_attention_triton(
            q,
            k,
            v,
            rule=triton.rule,
            normalise=triton.normalise,
            bias=triton.bias,
            eps=triton.eps,
            key_bias=key_bias,
            window=window,
            scale=scale,
        )
    except NoLaunchConfig as e:
        warn_fallback(e, "torch")
        return None


def _causal_blocks(q, k, v, of_scores: OfScores, key_bias, scale) -> torch.Tensor:
    """out (B,Tq,H,dv) of causal rows in blocks of QUERY_BLOCK queries: queries a..b-1 (positions off + a ..) take the
    scores over keys 0 .. off + b - 1, the ones they can see; the hidden keys after them would add nothing."""
    Tq, Tk = q.shape[1], k.shape[1]
    off, block = Tk - Tq, QUERY_BLOCK  # queries are the last Tq positions
    outs = []
    for a in range(0, Tq, block):
        n = off + min(Tq, a + block)  # keys up to the block's last query
        bias = None if key_bias is None else key_bias[..., :n]
        scores = attention_scores(q[:, a : a + block], k[:, :n], key_bias=bias, scale=scale)  # B,H,block,n
        outs.append(apply_pattern(of_scores(scores), v[:, :n], q.dtype))  # B,block,H,dv
    return torch.cat(outs, 1)
