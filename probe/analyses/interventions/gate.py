"""Gate clamp: scalar value gates and output gates held open, closed or at their clean-pass mean."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from probe.analyses.interventions.base import (
    GATE_MODES,
    Ablation,
    Intervention,
    NotTaken,
    check_choice,
    layers_of,
    local_conditions,
    register_intervention,
)
from probe.hooks import names


@register_intervention("gate")
@dataclass(frozen=True)
class GateClamp(Intervention):
    """Every value gate (hook_v_gate) and output gate (hook_out_gate) of the chosen layers held open (g = 1), closed
    (g = 0) or at its mean per layer and head over the clean pass. A routing-slot gate closed removes every key from
    the softmax: rows without a phantom keep their clean row, rows with one go to the phantom (value 0). A head: a KV
    head (and, with an output gate too, the output gates of its query heads), or a query head when the output gate is
    the model's only gate."""

    mode: str = "open"  # one of GATE_MODES

    @property
    def label(self) -> str:
        return self.mode

    def check(self, info) -> None:
        check_choice("gate clamp", self.mode, GATE_MODES)

    def query_heads(self, info) -> bool:
        return info.has_out_gate and not info.has_value_gate  # output gates are per query head

    def needs_gate_means(self) -> bool:
        return self.mode == "mean"

    def held(self, heads, gate_means):
        """A hook holding a gate (B,T,Hkv value; B,T,H or B,T,H,dv output) at the clamp, on ``heads`` (None: all)."""
        mode = self.mode

        def gate(g, hook):
            value = {
                "open": lambda: torch.ones_like(g),
                "closed": lambda: torch.zeros_like(g),
                "mean": lambda: gate_means[hook.name].to(g.device, g.dtype).expand_as(g),
            }[mode]()
            if heads is None:
                return value
            g = g.clone()
            g[:, :, heads] = value[:, :, heads]
            return g

        return gate

    def hooks(self, model, where: Ablation, mech=None, gate_means=None) -> list:
        info = model.probe_info
        layers = layers_of(where, info)
        one = None if where.head is None else slice(where.head, where.head + 1)
        group = None if where.head is None else slice(where.head * info.kv_group, (where.head + 1) * info.kv_group)
        out_heads = group if info.has_value_gate else one
        hooks = (
            [(names.attn(l, "out_gate"), self.held(out_heads, gate_means)) for l in layers] if info.has_out_gate else []
        )
        if not info.has_value_gate:
            return hooks
        if self.mode == "closed" and info.gate_on_logits:
            # routing slot: every key leaves the softmax. A row without a phantom would see nothing and keeps its clean
            # row (no hook); a row with one puts all its mass there, whose value is 0: the same as zero values.
            if not info.has_phantom:
                return hooks

            def to_phantom(v, hook):  # B,T,Hkv,dv
                v = v.clone()
                v[:, :, slice(None) if one is None else one] = 0
                return v

            return hooks + [(names.attn(l, "v_out"), to_phantom) for l in layers]
        return hooks + [(names.attn(l, "v_gate"), self.held(one, gate_means)) for l in layers]

    @classmethod
    def conditions(cls, model, mech, opts) -> list[Ablation]:
        info = model.probe_info
        if mech.gate_dims is None and not mech.out_gate:
            raise NotTaken(
                f"model {info.name!r} has no value gate or output gate (no hook_v_gate or hook_out_gate "
                "fires): gate clamps need a scalar value gate or an output gate"
            )
        if mech.gate_dims not in (None, 3):
            raise NotTaken(
                f"model {info.name!r} has an element-wise value gate (GatedV, GLU: one g per "
                "value coordinate); gate clamps take scalar gates (one g per key and KV head)"
            )
        out = []
        for mode in dict.fromkeys(opts.gate_modes):
            edit = cls(mode)
            edit.check(info)
            out += local_conditions(info, edit, opts, info.n_kv_heads if mech.gate_dims else info.n_heads)
        return out
