"""Readable reference of differential attention on materialised patterns (docs/definitions.md#differential-attention).

    p1, p2 = softmax(scale · q1 k1ᵀ), softmax(scale · q2 k2ᵀ)    two causal softmax rows per head (the branches)
    a      = p1 - λ_h p2                                         the signed net row, Σ_j a_ij = 1 - λ_h
    out_i  = Σ_j a_ij v_j

q holds the branch queries branch-major, q[..., b·H + h, :] = head h's branch b+1 query, and k its keys the same way
(k[..., b·Hkv + g, :]), so that one GQA softmax over 2H query heads gives both branches: query head b·H + h reads key
head (b·H + h) // (H / Hkv) = b·Hkv + h // (H / Hkv), its own branch's.
"""

from __future__ import annotations

import torch

from probe.kernels.common import wide
from probe.kernels.sink_attention.reference import apply_pattern, attention_scores, probs_of_scores


def branch_patterns(q, k, *, scale=None) -> tuple[torch.Tensor, torch.Tensor]:
    """q (B,Tq,2H,dh), k (B,Tk,2Hkv,dh) branch-major -> (p1, p2), each (B,H,Tq,Tk) fp32 (fp64 for fp64 inputs):
    the two branches' causal softmax rows."""
    return patterns_of_scores(attention_scores(q, k, scale=scale))


def patterns_of_scores(scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(p1, p2) (B,H,Tq,Tk) of both branches' scores (B,2H,Tq,Tk), branch-major, hidden keys -inf: softmax rows."""
    pattern = probs_of_scores(scores)[0]
    H = scores.shape[1] // 2
    return pattern[:, :H], pattern[:, H:]


def net_pattern(p1: torch.Tensor, p2: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """a = p1 - λ_h p2 (B,H,Tq,Tk), λ (H,) one per head (DIFF V1 shares one value over a layer's heads)."""
    return p1 - wide(lam).to(p1.dtype)[None, :, None, None] * p2


def diff_attention_reference(q, k, v, lam, *, scale=None, return_pattern: bool = False):
    """q (B,Tq,2H,dh), k (B,Tk,2Hkv,dh) branch-major, v (B,Tk,Hkv,dv), λ (H,) -> (out (B,Tq,H,dv) in q.dtype,
    p1, p2, a (B,H,Tq,Tk) fp32 or fp64 where return_pattern, else None)."""
    p1, p2 = branch_patterns(q, k, scale=scale)
    net = net_pattern(p1, p2, lam)
    out = apply_pattern(net, v, q.dtype)
    return (out, p1, p2, net) if return_pattern else (out, None, None, None)
