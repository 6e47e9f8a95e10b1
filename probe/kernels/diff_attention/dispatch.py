"""``diff_attention``: differential attention (DIFF V1) by one of two paths
(docs/definitions.md#differential-attention).

    backend    path
    torch      (default) "blocks" on the CPU where a gradient is needed and its kept rows fit SAVED_BYTES, else "sdpa"
    blocks     blocks.py: both branches' rows per block of queries, one autograd function (fastest CPU training path;
               keeps the rows for the backward)
    sdpa       one sink_attention call per branch on its fused path (SDPA / CPU flash / Triton: nothing T x T
               stored), both over the same values; out = o1 - λ o2
    reference  reference.py: both patterns materialised, through autograd

All give the same output and gradients (tests/models/test_diff.py). Attention edits (key-0 knockout,
window eviction) are sink attention's and are refused in one line: a knocked-out key would leave the two branches'
rows differently renormalised, which DIFF does not define.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from probe.kernels.common import check_attention_args, wide_dtype
from probe.kernels.diff_attention.blocks import diff_attention_blocks, saved_floats
from probe.kernels.diff_attention.reference import diff_attention_reference
from probe.kernels.row_rules import RowRule
from probe.kernels.sink_attention.dispatch import AttentionOutput, sink_attention

BACKENDS = ("torch", "blocks", "sdpa", "reference")
SAVED_BYTES = 256 * 2**20  # "torch" trains in blocks up to this much kept per call (B 16, T 256, H 2: 16 MB)


class DiffOutput(NamedTuple):
    out: torch.Tensor  # (B, Tq, H, dv) in q.dtype: Σ_j a_ij v_j, before the module's sub-layer norm
    pattern_1: torch.Tensor | None  # (B, H, Tq, Tk) fp32 branch 1's softmax rows (return_pattern)
    pattern_2: torch.Tensor | None  # (B, H, Tq, Tk) fp32 branch 2's softmax rows (return_pattern)
    pattern: torch.Tensor | None  # (B, H, Tq, Tk) fp32 the signed net rows p1 - λ p2 (return_pattern)


def lambda_init(layer: int) -> float:
    """λ_init = 0.8 - 0.6 exp(-0.3 (l - 1)) of the paper's 1-based layer l, i.e. of the 0-based ``layer`` index the
    authors' code (``depth``) and HF's DiffLlama (``layer_idx``) pass: 0.2 at the first layer."""
    return 0.8 - 0.6 * math.exp(-0.3 * layer)


def diff_attention(
    q, k, v, lam, *, scale=None, return_pattern: bool = False, backend: str = "torch", edit=None
) -> DiffOutput:
    """q (B,Tq,2H,dh), k (B,Tk,2Hkv,dh) branch-major (reference.py), v (B,Tk,Hkv,dv), λ (H,) -> DiffOutput.
    Causal; the patterns are returned (and the reference path taken) where return_pattern."""
    if edit is not None:
        raise ValueError("attention edits (knockout, eviction) are not supported under differential attention")
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not valid for differential attention; choose one of {BACKENDS}")
    _check(q, k, v, lam)
    if return_pattern or backend == "reference":
        return DiffOutput(*diff_attention_reference(q, k, v, lam, scale=scale, return_pattern=return_pattern))
    if backend == "torch":
        backend = "blocks" if _blocks_pay(q, k, v, lam) else "sdpa"
    if backend == "blocks":
        return DiffOutput(diff_attention_blocks(q, k, v, lam, scale=scale), None, None, None)
    H, Hkv = q.shape[2] // 2, k.shape[2] // 2
    # a call per branch rather than one over 2H heads: the values are not copied per branch, nor their gradient split
    o1 = sink_attention(q[:, :, :H], k[:, :, :Hkv], v, scale=scale).out  # B,Tq,H,dv
    o2 = sink_attention(q[:, :, H:], k[:, :, Hkv:], v, scale=scale).out
    return DiffOutput(o1 - lam.to(o2.dtype)[None, None, :, None] * o2, None, None, None)


def _blocks_pay(q, k, v, lam) -> bool:
    """Whether "torch" takes the blocks: on the CPU (where the flash kernel pads q and k to the values' width), under
    autograd (a forward alone stores nothing on the flash path), with the kept rows within SAVED_BYTES."""
    if q.device.type != "cpu" or not torch.is_grad_enabled():
        return False
    if not any(t.requires_grad for t in (q, k, v, lam)):
        return False
    return saved_floats(q, k) * wide_dtype(q.dtype).itemsize <= SAVED_BYTES


def _not_of_one_row(scores, bias: float = 0.0) -> torch.Tensor:
    raise ValueError("differential attention's rows are p1 - λ p2 of two branches' scores, not a rule of one row's")


def _not_a_row_op(*args, **kw) -> AttentionOutput:
    raise ValueError("differential attention runs diff_attention (two branches and λ), not a row rule's op")


# attn_fn -> its rule as the analyses read rows (probe.analyses.capture.row_rule): signed rows with no unspent mass,
# read as shares of each row's absolute mass (docs/definitions.md#signed-rows); the model runs diff_attention itself
SIGNED_RULES: dict[str, RowRule] = {"diff": RowRule(_not_a_row_op, _not_of_one_row, at_most_one=False)}


def _check(q, k, v, lam) -> None:
    """Two branches per head: an even number of query and key heads, λ one per head, Hkv value heads for Hkv keys."""
    if q.dim() != 4 or k.dim() != 4 or q.shape[2] % 2 or k.shape[2] % 2:
        got = f"{tuple(q.shape)}, {tuple(k.shape)}"
        raise ValueError(f"q (B,Tq,2H,dh) and k (B,Tk,2Hkv,dh) hold two branches; got {got}")
    H, Hkv = q.shape[2] // 2, k.shape[2] // 2
    if v.dim() != 4 or v.shape[2] != Hkv or lam.shape != (H,):
        raise ValueError(f"v must be (B,Tk,{Hkv},dv) and λ ({H},); got {tuple(v.shape)}, {tuple(lam.shape)}")
    check_attention_args(q[:, :, :H], k[:, :, :Hkv], v, None, None, None)
