"""Window eviction (StreamingLLM): query t sees keys 0 .. keep-1 and t-window+1 .. t in every softmax layer, carried
out by the attention op, keys at their positions in the text or within the cache
(docs/definitions.md#window-eviction)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from probe.analyses.interventions.base import (
    MAX_POSITIONS,
    Ablation,
    AblationError,
    Intervention,
    check_choice,
    check_softmax_rows,
    layers_of,
    register_intervention,
    whole,
)
from probe.hooks import names
from probe.kernels.sink_attention import edits

POSITIONS = edits.POSITIONS  # eviction: keys at their positions in the text, or within the cache


@register_intervention("evict")
@dataclass(frozen=True)
class Eviction(Intervention):
    """Keys at their positions in the text (``positions="original"``, the op's kept-first-keys rule) or within the
    cache as StreamingLLM assigns them (``"cache"``: rotary models, the queries re-rotated by each layer's own
    rotary); the loss over all queries and over queries t >= keep + window."""

    keep: int = 0  # the first keys kept visible
    window: int = 1  # query t sees t-window+1 .. t
    positions: str = "original"  # one of POSITIONS

    takes_head = False

    @property
    def label(self) -> str:
        return f"k={self.keep},w={self.window}" + ("" if self.positions == "original" else f",pos={self.positions}")

    def check(self, info) -> None:
        check_choice("eviction positions", self.positions, POSITIONS)
        if not whole(self.window, 1):
            raise AblationError(f"eviction window must be an int 1..{MAX_POSITIONS}, got {self.window!r}")
        if not whole(self.keep, 0):
            raise AblationError(f"kept first keys must be an int 0..{MAX_POSITIONS}, got {self.keep!r}")

    def late_queries(self, T: int) -> torch.Tensor:
        return torch.arange(T) >= min(self.keep + self.window, T)

    def attention_edit(self, model, layer: int, T: int, device) -> edits.AttentionEdit:
        """The edit layer ``layer``'s op carries out over T keys: at cache positions with the layer's own rotary at
        positions 0 .. T-1."""
        rotary = model.rotary_tables(layer, T, device) if self.positions == "cache" else None
        return edits.AttentionEdit(keep=self.keep, window=self.window, positions=self.positions, rotary=rotary)

    def hooks(self, model, where: Ablation, mech=None, gate_means=None) -> list:
        def carry(v, hook):  # B,T,Hkv,dv: hand the layer's edit to its attention op
            edits.carry(hook, self.attention_edit(model, names.layer_of(hook.name), v.shape[1], v.device))

        return [(names.attn(l, "v_out"), carry) for l in layers_of(where, model.probe_info)]

    @classmethod
    def conditions(cls, model, mech, opts) -> list[Ablation]:
        info, out = model.probe_info, []
        check_softmax_rows("evict", info)
        for pos in dict.fromkeys(opts.positions):
            check_positions(model, pos)
            for w in dict.fromkeys(opts.windows):
                for k in dict.fromkeys(opts.keep):
                    cls(k, w, pos).check(info)
                    out.append(Ablation(cls(int(k), int(w), pos)))
        return out


def check_positions(model, positions: str) -> None:
    """Eviction positions the model can take: within the cache needs a rotary position embedding in every layer
    (``model.rotary_tables``); else one AblationError line."""
    check_choice("eviction positions", positions, POSITIONS)
    if positions == "original":
        return
    info = model.probe_info
    tables = getattr(model, "rotary_tables", None)
    # the softmax layers' rotaries: a linear layer has no attention whose keys eviction moves
    missing = [l for l in info.attention_layers if tables is None or tables(l, 2) is None]
    if missing:
        raise AblationError(
            f"model {info.name!r} has no rotary position embedding in layer {missing[0]}: eviction at positions "
            "within the cache re-rotates each query by its layer's rotary (rotate-half pairs over the leading "
            "coordinates; interleaved, latent-attention and complex rotaries are not); use positions original"
        )
