"""Value edit: position 0's value read set to zero, the mean of the other reads, or the read at position 1."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from probe.analyses.interventions.base import (
    VALUE_MODES,
    Ablation,
    Intervention,
    check_choice,
    layers_of,
    local_conditions,
    register_intervention,
)
from probe.hooks import names


@register_intervention("value")
@dataclass(frozen=True)
class ValueEdit(Intervention):
    """v_0 at hook_v set to zero, to the mean of its KV head's reads over positions 1 .. T-1 of the same window, or to
    the read at position 1; a value gate sees the edited read."""

    mode: str = "zero"  # one of VALUE_MODES

    @property
    def label(self) -> str:
        return self.mode

    def check(self, info) -> None:
        check_choice("value ablation", self.mode, VALUE_MODES)

    def hooks(self, model, where: Ablation, mech=None, gate_means=None) -> list:
        heads = slice(None) if where.head is None else slice(where.head, where.head + 1)
        mode = self.mode

        def value(v, hook):  # B,T,Hkv,dv
            if getattr(model, "padded_forward", False):  # an HF forward with pads: position 0 is not each row's first
                raise RuntimeError(
                    "a value edit (position 0's read) needs unpadded sequences: with padding, position 0 is not each "
                    "sequence's first token; pass windows without an attention mask"
                )
            new = {
                "zero": lambda: torch.zeros_like(v[:, 0]),
                "mean": lambda: v[:, 1:].mean(1),
                "swap": lambda: v[:, 1],
            }[mode]()
            v = v.clone()
            v[:, 0, heads] = new[:, heads]
            return v

        return [(names.attn(l, "v"), value) for l in layers_of(where, model.probe_info)]

    @classmethod
    def conditions(cls, model, mech, opts) -> list[Ablation]:
        info, out = model.probe_info, []
        for mode in dict.fromkeys(opts.value_modes):
            edit = cls(mode)
            edit.check(info)
            out += local_conditions(info, edit, opts, info.n_kv_heads)
        return out
