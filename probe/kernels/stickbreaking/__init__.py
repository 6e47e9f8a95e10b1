"""Stick-breaking attention (Tan et al., ICLR 2025, "Scaling Stick-Breaking Attention"): each key, from the nearest
back, takes a share sigmoid(s_ij) of the stick the nearer keys left; rows sum to at most one and the leftover is the
row's phantom (docs/definitions.md#stick-breaking-attention).

    reference.py   the plain PyTorch rule on materialised (B, H, Tq, Tk) scores, in log space
    fused.py       the same rule as one autograd function with its backward written out (saves scores and weights)
    dispatch.py    ``stickbreaking_attention``: the op the models call (backend "torch": fused.py; "reference")
"""

from probe.kernels.stickbreaking.dispatch import stickbreaking_attention
from probe.kernels.stickbreaking.reference import stickbreaking_of_scores

__all__ = ["stickbreaking_attention", "stickbreaking_of_scores"]
