"""softpick (Zuhri et al. 2025, "Softpick: No Attention Sink, No Massive Activations with Rectified Softmax"): the
rectified, not-normalised-to-one replacement of softmax in causal attention (docs/definitions.md#softpick).

    reference.py   the plain PyTorch rule on materialised (B, H, Tq, Tk) scores
    fused.py       the same rule as one autograd function with its backward written out (fewer T x T passes)
    triton.py      the rule's online per-tile math for probe.kernels.rule_triton's kernels (backend "triton")
    dispatch.py    ``softpick_attention``: the op the models call (backend "torch": fused.py; "reference")
"""

from probe.kernels.softpick.dispatch import softpick_attention
from probe.kernels.softpick.reference import SOFTPICK_EPS, softpick_of_scores

__all__ = ["SOFTPICK_EPS", "softpick_attention", "softpick_of_scores"]
