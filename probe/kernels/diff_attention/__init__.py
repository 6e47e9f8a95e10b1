"""Differential attention, DIFF V1 (Ye et al. 2024, "Differential Transformer", arXiv 2410.05258): each head's row is
the difference of two softmax rows, a_i = p1_i - λ p2_i, a signed row summing to 1 - λ
(docs/definitions.md#differential-attention).

    reference.py   both branches' patterns materialised (B, H, Tq, Tk), their signed difference applied to v
    blocks.py      both branches' rows per block of queries and their difference applied to v once, one autograd
                   function: the CPU training path
    dispatch.py    ``diff_attention``: the op the models call (backend "torch": blocks.py on the CPU under autograd,
                   else "sdpa": two fused softmax attentions, nothing T x T stored; "blocks", "sdpa", "reference")

The per-head sub-layer norm and the (1 - λ_init) scale are the module's (probe.models.attention), not the op's.
"""

from probe.kernels.diff_attention.dispatch import BACKENDS, SIGNED_RULES, DiffOutput, diff_attention, lambda_init
from probe.kernels.diff_attention.reference import (
    branch_patterns,
    diff_attention_reference,
    net_pattern,
    patterns_of_scores,
)

__all__ = [
    "BACKENDS",
    "SIGNED_RULES",
    "DiffOutput",
    "branch_patterns",
    "diff_attention",
    "diff_attention_reference",
    "lambda_init",
    "net_pattern",
    "patterns_of_scores",
]
