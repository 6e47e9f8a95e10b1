"""Test-time register (Jiang et al. 2025): one extra token with a zero embedding joins the window, and the register
neurons' activations (``mlp.hook_post``) move to it: at the register, each layer's register neurons take the
activation of largest magnitude among them over the window (the authors' ``sign_max``, one value per layer and
window); at the text positions they are zeroed (docs/definitions.md#register-neurons).

Departure for causal LMs: the authors append the register after the image patches, where every patch sees it; in a
causal LM a token after the text is seen by no text query, so the register goes before the text by default
(``at="start"``: the text moves one position on) and after it with ``at="end"`` (the authors' place). They leave the
CLS token's activations as they are; a causal LM has none, so every text position is zeroed. The register's own
position is left out of the loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from probe.analyses.interventions.base import (
    Ablation,
    AblationError,
    Intervention,
    NotTaken,
    check_choice,
    register_intervention,
)
from probe.analyses.register_neurons import missing_mlp_hooks
from probe.hooks import names

REGISTER_PLACES = ("start", "end")  # before the text (causal LMs: seen by every query) or after it (the authors')


@register_intervention("register")
@dataclass(frozen=True)
class TestTimeRegister(Intervention):
    """A register token at ``at`` and the register ``neurons`` ((layer, neuron) pairs) moved onto it; no neurons:
    the register token alone (the control)."""

    __test__ = False  # a product class, not a pytest test class
    neurons: tuple = ()  # ((layer, neuron), ...)
    at: str = "start"  # REGISTER_PLACES
    takes_head: ClassVar[bool] = False
    on_softmax_layers: ClassVar[bool] = False
    extra_tokens: ClassVar[int] = 1

    @property
    def label(self) -> str:
        moved = f"{len(self.neurons)} neurons" if self.neurons else "token only"
        return f"{moved},at={self.at}"

    def check(self, info) -> None:
        check_choice("register place", self.at, REGISTER_PLACES)
        for pair in self.neurons:
            layer, neuron = pair
            if not (0 <= layer < info.n_layers and neuron >= 0):
                raise AblationError(
                    f"register neuron {tuple(pair)!r} is not in model {info.name!r}: layers 0..{info.n_layers - 1}, "
                    "neurons from 0"
                )

    def register_index(self, T: int) -> int:
        """The register's position in a window of T text tokens."""
        return 0 if self.at == "start" else T

    def text_slice(self, T: int) -> slice:
        """The text's positions in the extended window."""
        return slice(1, T + 1) if self.at == "start" else slice(0, T)

    def extend(self, ids: torch.Tensor) -> torch.Tensor:
        """(B, T) -> (B, T+1): a slot for the register (its id is the first token's; its embedding is zeroed)."""
        parts = (ids[:, :1], ids) if self.at == "start" else (ids, ids[:, :1])
        return torch.cat(parts, dim=1)

    def hooks(self, model, where: Ablation, mech=None, gate_means=None) -> list:
        by_layer: dict[int, list[int]] = {}
        for layer, neuron in self.neurons:
            by_layer.setdefault(int(layer), []).append(int(neuron))

        def zero_embedding(x, hook):  # B,T+1,d
            x = x.clone()
            x[:, self.register_index(x.shape[1] - 1)] = 0
            return x

        # the authors' register enters after the position embedding: a zero vector, so a learned one is zeroed too
        embeds = [e for e in (names.EMBED, names.pos_embed()) if e in model.hook_dict]
        out = [(e, zero_embedding) for e in embeds]
        name = model.probe_info.name
        return out + [(names.mlp(l), self._mover(idx, l, name)) for l, idx in sorted(by_layer.items())]

    def _mover(self, neurons: list[int], layer: int, model_name: str):
        """A hook on one layer's mlp.hook_post moving ``neurons`` onto the register; a neuron past the layer's
        width is one AblationError line (the width is known once the layer runs)."""

        def move(a, hook):  # B,T+1,m
            if max(neurons) >= a.shape[-1]:
                raise AblationError(
                    f"register neuron {(layer, max(neurons))!r} is not in model {model_name!r}: layer {layer}'s MLP "
                    f"has neurons 0..{a.shape[-1] - 1}"
                )
            T = a.shape[1] - 1
            a = a.clone()
            idx = torch.tensor(neurons, device=a.device)
            sel = a[:, :, idx].flatten(1)  # B, (T+1)*k
            top, bottom = sel.max(1).values, sel.min(1).values  # B
            a[:, self.register_index(T), idx] = torch.where(top.abs() > bottom.abs(), top, bottom)[:, None]
            a[:, self.text_slice(T), idx] = 0
            return a

        return move

    @classmethod
    def conditions(cls, model, mech, opts) -> list[Ablation]:
        info = model.probe_info
        if why := missing_mlp_hooks(model):
            raise NotTaken(why)
        neurons = tuple(tuple(int(x) for x in pair) for pair in opts.register_neurons)
        places = dict.fromkeys(opts.register_at)
        edits = dict.fromkeys([cls(neurons, at) for at in places] + [cls((), at) for at in places])  # (): token alone
        for edit in edits:
            edit.check(info)
        return [Ablation(edit) for edit in edits]


def sink_share_hooks(info, text: slice, register: int | None, sums: dict) -> list:
    """Hooks on every softmax layer's hook_pattern adding to ``sums`` the attention mass of the text queries after
    the first (``text``: their positions) on the first text token (``pos0``) and on the register (``register``:
    its position, None for none), and the number of (window, head, query, layer) rows (``rows``)."""

    def add(p, hook):  # B,H,Tq,Tk
        rows = p[:, :, text][:, :, 1:]  # B,H,T-1,Tk: text queries t >= 1
        sums["pos0"] = sums.get("pos0", 0.0) + float(rows[..., text.start].double().sum())
        if register is not None:
            sums["register"] = sums.get("register", 0.0) + float(rows[..., register].double().sum())
        sums["rows"] = sums.get("rows", 0) + rows[..., 0].numel()

    return [(names.attn(l, "pattern"), add) for l in info.attention_layers]
