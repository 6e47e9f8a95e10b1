"""Pointwise attention rules: each key's weight a function of its own score alone, optionally divided by the row's sum
(docs/definitions.md#pointwise-attention-rules). Sigmoid attention (Ramapuram et al. 2024: sigmoid(s + b), b = -log n,
not normalised) and Gu et al. 2025's similarity kernels (sigmoid and ELU+1, with and without normalisation).

    reference.py   the plain PyTorch rule on materialised (B, H, Tq, Tk) scores
    fused.py       the same rule as one autograd function with its backward written out (fewer T x T passes)
    triton.py      the rule's per-tile math for probe.kernels.rule_triton's kernels (backend "triton")
    dispatch.py    ``pointwise_attention``: the op the models call (backend "torch": fused.py; "reference")
"""

from probe.kernels.pointwise.dispatch import pointwise_attention
from probe.kernels.pointwise.reference import KERNELS, NORM_EPS, pointwise_of_scores

__all__ = ["KERNELS", "NORM_EPS", "pointwise_attention", "pointwise_of_scores"]
