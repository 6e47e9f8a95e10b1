"""The attention row rules other than softmax, by name: the one registry the models (``attn_fn``), the hook algebra
and ``ModelInfo.attention_rule`` read (docs/definitions.md#softpick, docs/definitions.md#pointwise-attention-rules).

Softmax is not here: it is sink attention's own rule (probe.kernels.sink_attention), with its phantom key and lse.
Each rule here has no log-normaliser (hook_lse does not fire); ``at_most_one`` says whether its rows sum to at most
one, so that 1 - the row's sum is mass the row leaves unspent (hook_phantom); rows of the other rules may sum past
one, and hook_phantom does not fire under them (their row mass is Σ_j hook_pattern).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from probe.kernels.pointwise import pointwise_attention, pointwise_of_scores
from probe.kernels.sink_attention.dispatch import AttentionOutput
from probe.kernels.softpick import softpick_attention, softpick_of_scores
from probe.kernels.stickbreaking import stickbreaking_attention, stickbreaking_of_scores


@dataclass(frozen=True)
class RowRule:
    """One rule: its attention op, the same rule on materialised scores, and what its rows sum to."""

    # (q, k, v, *, bias, key_bias, return_pattern, edit) -> AttentionOutput; phantom None where not at_most_one
    attention: Callable[..., AttentionOutput]
    # (scores (B,H,Tq,Tk), hidden keys -inf; bias) -> weights (B,H,Tq,Tk), differentiable
    of_scores: Callable[..., torch.Tensor]
    at_most_one: bool  # rows sum to at most one (hook_phantom = 1 - Σ_j pattern fires)
    context_bias: bool = False  # the rule adds b = -log n_ctx to every score (Ramapuram et al.'s sigmoid)

    def bias(self, n_ctx: int) -> float:
        """The constant logit bias of a model with context n_ctx."""
        return -math.log(n_ctx) if self.context_bias else 0.0


def _op_without_bias(attention: Callable[..., AttentionOutput], q, k, v, *, bias: float = 0.0, **kw):
    return attention(q, k, v, **kw)  # the rule takes no logit bias (bias is always 0 for it)


def _rule_without_bias(of_scores: Callable[..., torch.Tensor], scores: torch.Tensor, bias: float = 0.0):
    return of_scores(scores)


def _biasless(attention: Callable[..., AttentionOutput], of_scores: Callable[..., torch.Tensor]) -> RowRule:
    """A rule that takes no logit bias and whose rows sum to at most one (partials of module functions: picklable)."""
    return RowRule(partial(_op_without_bias, attention), partial(_rule_without_bias, of_scores), at_most_one=True)


def _pointwise(kernel: str, normalise: bool, context_bias: bool = False) -> RowRule:
    return RowRule(
        attention=partial(pointwise_attention, kernel=kernel, normalise=normalise),
        of_scores=partial(pointwise_of_scores, kernel=kernel, normalise=normalise),
        at_most_one=normalise,
        context_bias=context_bias,
    )


# attn_fn -> its rule (softmax, the default, is sink attention's and not listed)
ROW_RULES: dict[str, RowRule] = {
    "softpick": _biasless(softpick_attention, softpick_of_scores),  # Zuhri et al. 2025
    "sigmoid": _pointwise("sigmoid", normalise=False, context_bias=True),  # Ramapuram et al. 2024, b = -log n_ctx
    "sigmoid-norm": _pointwise("sigmoid", normalise=True),  # Gu et al. 2025, sigmoid / Σ sigmoid
    "elu1": _pointwise("elu1", normalise=False),  # Gu et al. 2025, elu + 1
    "elu1-norm": _pointwise("elu1", normalise=True),  # Gu et al. 2025, (elu + 1) / Σ (elu + 1)
    "stickbreaking": _biasless(stickbreaking_attention, stickbreaking_of_scores),  # Tan et al. 2025
}
