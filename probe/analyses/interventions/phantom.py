"""Phantom edit: the phantom logit removed (-inf: plain softmax) or fixed; models without a phantom are refused."""

from __future__ import annotations

from dataclasses import dataclass

from probe.analyses.interventions.base import (
    Ablation,
    AblationError,
    Intervention,
    NotTaken,
    layers_of,
    local_conditions,
    register_intervention,
)
from probe.hooks import names
from probe.kernels.row_rules import ROW_RULES

MAX_SINK_LOGIT = 1e4  # a fixed phantom logit beyond +-1e4 is an infinite one for the softmax (and past fp16's range)


@register_intervention("phantom")
@dataclass(frozen=True)
class PhantomEdit(Intervention):
    """The phantom logit at hook_sink_logit set to ``logit`` (None: removed, -inf), per query head."""

    logit: float | None = None  # None: the phantom removed (-inf); else a finite logit within +-MAX_SINK_LOGIT

    @property
    def label(self) -> str:
        return "remove" if self.logit is None else f"logit={self.logit:g}"

    def query_heads(self, info) -> bool:
        return True  # phantom logits are per query head

    def check(self, info) -> None:
        if not info.has_phantom:
            rule = ROW_RULES.get(info.attention_rule)
            unspent = (  # rows that sum to at most one: hook_phantom reads out what they leave, but no logit sets it
                f"; the mass its {info.attention_rule} rows leave unspent (hook_phantom) has no logit to edit"
                if rule is not None and rule.at_most_one
                else ""
            )
            raise NotTaken(
                f"model {info.name!r} has no phantom key (off-by-one, sink logit or gpt-oss "
                f"sinks): phantom edits need one{unspent}"
            )
        c = self.logit
        if c is not None and (not isinstance(c, (int, float)) or not abs(c) <= MAX_SINK_LOGIT):
            raise AblationError(
                f"sink logit {c!r} is not a finite number within +-{MAX_SINK_LOGIT:g} (the phantom's removal is -inf)"
            )

    def hooks(self, model, where: Ablation, mech=None, gate_means=None) -> list:
        logit = float("-inf") if self.logit is None else float(self.logit)
        heads = slice(None) if where.head is None else where.head

        def phantom(sink, hook):  # H
            sink = sink.clone()
            sink[heads] = logit
            return sink

        return [(names.attn(l, "sink_logit"), phantom) for l in layers_of(where, model.probe_info)]

    @classmethod
    def conditions(cls, model, mech, opts) -> list[Ablation]:
        info = model.probe_info
        cls().check(info)
        logits = list(dict.fromkeys(opts.sink_logits))
        for c in logits:
            cls(c).check(info)
        edits = [cls()] + [cls(float(c)) for c in logits]
        return [a for edit in edits for a in local_conditions(info, edit, opts, info.n_heads)]
