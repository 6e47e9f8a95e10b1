"""Key-0 knockout: key 0 leaves every query's softmax, carried out by the attention op
(docs/definitions.md#ablations)."""

from __future__ import annotations

from dataclasses import dataclass

from probe.analyses.interventions.base import (
    Ablation,
    Intervention,
    check_softmax_rows,
    layers_of,
    local_conditions,
    register_intervention,
)
from probe.hooks import names
from probe.kernels.sink_attention import edits


@register_intervention("knockout")
@dataclass(frozen=True)
class Knockout(Intervention):
    """Key 0 out of every query's softmax (rows renormalise over the other keys and the phantom; query 0 of a head
    without a phantom keeps its clean row), by the op's own per-key bias: an AttentionEdit handed to each layer's op
    from its hook_v_out."""

    @property
    def label(self) -> str:
        return "key0"

    def hooks(self, model, where: Ablation, mech=None, gate_means=None) -> list:
        edit = edits.AttentionEdit(knockout=True, kv_heads=None if where.head is None else (where.head,))
        return [(names.attn(l, "v_out"), hand_over(edit)) for l in layers_of(where, model.probe_info)]

    @classmethod
    def conditions(cls, model, mech, opts) -> list[Ablation]:
        info = model.probe_info
        check_softmax_rows("knockout", info)
        return local_conditions(info, cls(), opts, info.n_kv_heads)


def hand_over(edit: edits.AttentionEdit):
    """A hook on a layer's hook_v_out that hands ``edit`` to the layer's attention op (edits.carry)."""

    def carry(v, hook):  # B,T,Hkv,dv
        edits.carry(hook, edit)

    return carry
