"""Row masses of differential attention's signed rows (probe.kernels.diff_attention; docs/definitions.md#signed-rows).

    p1, p2        = the two branches' softmax rows                 (q, k: 2H / 2Hkv heads, branch-major)
    a_ij          = p1_ij - λ_h p2_ij                              the net row, hook_pattern
    net_i         = Σ_j a_ij           = 1 - λ_h                   the row's signed sum (row_mass)
    absolute_i    = Σ_j |a_ij|                                     the row's absolute mass, the shares' denominator
    masses[.., c] = Σ_j |a_ij| indicators[b, j, h // G, c]         the net row's absolute mass on the marked keys
    branch_b[.., c] = Σ_j pb_ij indicators[b, j, h // G, c]        each branch's plain softmax masses

No log-normaliser streams the absolute value of a difference, so the scores are made explicitly over blocks of query
rows and the keys they can see (rules.score_blocks: block x (block + window) at most, never T x T). fp32, fp64 for
fp64 inputs.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from probe.kernels.common import check_attention_args
from probe.kernels.diff_attention import net_pattern, patterns_of_scores
from probe.kernels.row_masses.rules import ROW_BLOCK, indicator_masses, score_blocks


class SignedRowMasses(NamedTuple):
    net: torch.Tensor  # (B, H, T) Σ_j a_ij, the signed row sum
    absolute: torch.Tensor  # (B, H, T) Σ_j |a_ij|
    masses: torch.Tensor  # (B, H, T, m) Σ_j |a_ij| on each indicator column
    branch_1: torch.Tensor  # (B, H, T, m) branch 1's softmax mass on each column
    branch_2: torch.Tensor  # (B, H, T, m) branch 2's


def signed_row_masses(
    q, k, indicators, lam, *, window=None, chunk=None, scale=None, softcap=None, block: int = ROW_BLOCK
) -> SignedRowMasses:
    """q (B,T,2H,dh), k (B,T,2Hkv,dh) branch-major, indicators (B,T,Hkv,m) per value head, or (B,T,2Hkv,m) per key
    head as built from k's shape (the first branch's columns are read), λ (H,) -> SignedRowMasses; window, chunk,
    soft-cap and scale as rule_row_masses takes them (one sequence, as many queries as keys)."""
    H, Hkv = q.shape[2] // 2, k.shape[2] // 2
    indicators = indicators[:, :, :Hkv]  # per key head: both branches' columns mark the same keys
    check_attention_args(q[:, :, :H], k[:, :, :Hkv], indicators, None, None, window)
    if q.shape[1] != k.shape[1] or lam.shape != (H,):
        raise ValueError(f"signed_row_masses takes one sequence and λ ({H},); got λ {tuple(lam.shape)}")
    parts: dict[str, list[torch.Tensor]] = {name: [] for name in SignedRowMasses._fields}
    for s, ind in score_blocks(q, k, indicators, None, window, chunk, scale, softcap, block):
        p1, p2 = patterns_of_scores(s)  # (B, H, rows, keys) each
        a = net_pattern(p1, p2, lam)
        parts["net"].append(a.sum(-1))
        parts["absolute"].append(a.abs().sum(-1))
        parts["masses"].append(indicator_masses(a.abs(), ind))
        parts["branch_1"].append(indicator_masses(p1, ind))
        parts["branch_2"].append(indicator_masses(p2, ind))
    rows = {"net": -1, "absolute": -1}  # (B, H, T) parts join on their last dim, (B, H, T, m) ones on the row dim
    return SignedRowMasses(**{n: torch.cat(p, dim=rows.get(n, -2)) for n, p in parts.items()})
