"""The typed edits of probe.analyses.ablate: the base class of an intervention, their registry, a condition
(:class:`Ablation`: an intervention and where it acts), the run's options with their one statement of the defaults,
and the check that a condition's layer and head exist.

An intervention is a frozen dataclass of its fields, registered by name with ``@register_intervention(name)`` (as
value gates are with ``@register_gate``, probe.models.registry). It gives its ``label`` (the ``setting`` column of
the tables), ``check(info)`` (one AblationError line naming a bad value and the valid choices), ``conditions`` (every
condition of the kind a run's options ask for, validated against the model) and ``hooks`` (the (hook name, fn) pairs
that carry it out).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

import torch

from probe.analyses.interventions.mechanisms import Mechanisms
from probe.models.registry import registrar

VALUE_MODES = ("zero", "mean", "swap")
GATE_MODES = ("open", "closed", "mean")
DEPTH_MODES = ("uniform", "residual", "drop")
DEFAULT_KEEP = (0, 1, 4)
DEFAULT_WINDOWS = (64,)
MAX_POSITIONS = 2**31 - 1  # kept keys and eviction windows: positions, far beyond any context

KINDS: dict[str, type[Intervention]] = {}  # intervention name -> its class, in registration order
_register = registrar(KINDS, "intervention")


def register_intervention(name: str):
    """Class decorator: ``@register_intervention("mine")`` makes ``ablate(..., ["mine"])`` plan that class."""

    def add(cls):
        cls.name = name
        return _register(name)(cls)

    return add


class AblationError(ValueError):
    """An intervention the model cannot take (one line naming the model and what it lacks)."""


class NotTaken(AblationError):
    """The model has nothing the intervention acts on (no phantom key, no gate, no depth routing, rows that are not
    softmax's): :func:`probe.analyses.ablate.plan` adds the interventions the model does take to its line."""


@dataclass(frozen=True)
class AblationOptions:
    """The settings a run asks for, with their defaults (the one statement :func:`ablate` and :func:`plan` share)."""

    value_modes: tuple = ("zero", "mean")  # value: VALUE_MODES
    sink_logits: tuple = ()  # phantom: fixed phantom logits (besides its removal)
    gate_modes: tuple = GATE_MODES  # gate clamps
    keep: tuple = DEFAULT_KEEP  # eviction: first keys kept
    windows: tuple = DEFAULT_WINDOWS  # eviction: recent-key windows
    positions: tuple = ("original",)  # eviction: where the keys sit (probe.kernels.sink_attention.edits.POSITIONS)
    depth_modes: tuple | None = None  # depth forcings (None: DEPTH_MODES, each where the model takes it)
    register_neurons: tuple = ()  # register: (layer, neuron) pairs moved onto the test-time register
    register_at: tuple = ("start",)  # register: where it sits (before or after the text)
    per_layer: bool = True  # also one layer (depth: one read site) at a time
    per_head: bool = False  # also one head at a time

    @classmethod
    def of(cls, settings: dict) -> AblationOptions:
        """The options of keyword ``settings``; a name that is not an option is one TypeError line."""
        unknown = [k for k in settings if k not in {f.name for f in fields(cls)}]
        if unknown:
            raise TypeError(
                f"unknown ablation option {unknown[0]!r}; choose from {', '.join(f.name for f in fields(cls))}"
            )
        return cls(**settings)


class Intervention:
    """One kind of intervention; subclasses are frozen dataclasses of its fields."""

    name: ClassVar[str] = ""
    takes_head: ClassVar[bool] = True  # one head at a time is a condition of this kind
    on_softmax_layers: ClassVar[bool] = True  # acts on softmax layers (False: on depth read sites)
    extra_tokens: ClassVar[int] = 0  # tokens it adds to a window (a test-time register: 1), left out of the loss

    def extend(self, ids: torch.Tensor) -> torch.Tensor:
        """The ids of its forward: (B, T) -> (B, T + extra_tokens)."""
        return ids

    def register_index(self, T: int) -> int | None:
        """The position of the token it adds to a window of T text tokens (None: it adds none)."""
        return None

    def text_slice(self, T: int) -> slice:
        """The positions of a window's T text tokens in its forward."""
        return slice(0, T)

    @property
    def label(self) -> str:
        """The ``setting`` column of the tables."""
        raise NotImplementedError

    def check(self, info) -> None:
        """One AblationError line when a field's value is not one the model (``info``: its ModelInfo) takes."""

    def query_heads(self, info) -> bool:
        """Is a condition's head a query head (else a KV head)?"""
        return False

    def late_queries(self, T: int) -> torch.Tensor | None:
        """(T,) bool: queries reported apart (``*_late`` columns), or None."""
        return None

    def needs_gate_means(self) -> bool:
        """Does it read the gates' means over the clean pass?"""
        return False

    def hooks(self, model, where: Ablation, mech: Mechanisms | None, gate_means: dict | None) -> list:
        """The (hook name, fn) pairs that carry it out at ``where`` (its layer, head or site)."""
        raise NotImplementedError

    @classmethod
    def conditions(cls, model, mech: Mechanisms, opts: AblationOptions) -> list[Ablation]:
        """Every condition of this kind that ``opts`` asks for; AblationError on one the model cannot take."""
        raise NotImplementedError


@dataclass(frozen=True)
class Ablation:
    """One condition: an intervention and where it acts (every layer / site, or one)."""

    edit: Intervention
    layer: int | None = None  # None: every layer at once
    head: int | None = None  # a KV head (a query head for phantom edits)
    site: str | None = None  # a depth read site (None: every site)

    @property
    def intervention(self) -> str:
        return self.edit.name

    @property
    def setting(self) -> str:
        return self.edit.label

    @property
    def scope(self) -> str:
        if self.site is not None:
            return "site"
        return "head" if self.head is not None else ("layer" if self.layer is not None else "model")


def local_conditions(info, edit: Intervention, opts: AblationOptions, n_heads: int) -> list[Ablation]:
    """``edit`` on every softmax layer at once, then (per_layer) one layer at a time and (per_head) one head."""
    out = [Ablation(edit)]
    for l in info.attention_layers if opts.per_layer or opts.per_head else ():
        if opts.per_layer:
            out.append(Ablation(edit, l))
        for h in range(n_heads) if opts.per_head else ():
            out.append(Ablation(edit, l, h))
    return out


def whole(x, low: int) -> bool:
    """An int-valued number in low..MAX_POSITIONS."""
    number = isinstance(x, (int, float)) and not isinstance(x, bool)
    return number and low <= x <= MAX_POSITIONS and int(x) == x  # NaN fails the comparison


def check_choice(what: str, value, choices) -> None:
    """One AblationError line when ``value`` is not among ``choices``."""
    if value not in choices:
        raise AblationError(f"unknown {what} {value!r}; choose from {', '.join(choices)}")


def check_target(abl: Ablation, info) -> None:
    """The layer and head of a condition exist in the model, for every kind alike (heads: query heads for phantom
    edits and a model's only gate being an output gate, KV heads otherwise); else one AblationError line naming the
    valid range."""
    kind = abl.intervention
    query_heads = abl.edit.query_heads(info)
    n_heads = info.n_heads if query_heads else info.n_kv_heads
    what = "query heads" if query_heads else "KV heads"
    for name, value, n in (("layer", abl.layer, info.n_layers), ("head", abl.head, n_heads)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < n):
            extra = f" ({what})" if name == "head" else ""
            raise AblationError(
                f"{kind} ablation: {name} {value!r} is not in model {info.name!r}, which has {name}s 0..{n - 1}{extra}"
            )
    if abl.head is not None and not abl.edit.takes_head:
        raise AblationError(f"{kind} ablation: takes no head (it acts on every head of a layer or site)")
    if abl.layer is not None and abl.layer not in info.attention_layers and abl.edit.on_softmax_layers:
        raise AblationError(
            f"{kind} ablation: layer {abl.layer} of model {info.name!r} is a linear layer (no softmax "
            f"attention, hence no key 0, reads, phantom or gate to edit); its softmax layers: {info.attention_layers}"
        )


def layers_of(abl: Ablation, info) -> list[int]:
    """The softmax layers a condition acts on."""
    return info.attention_layers if abl.layer is None else [abl.layer]


def refuse_attention_edits(info, what: str) -> None:
    """One AblationError line where a layer's rows are not softmax rows: the knockout and the eviction are carried out
    by sink attention's op, and a row rule's or differential attention's op refuses them (their renormalisation is
    not defined there)."""
    rule = next((r.rule for r in map(info.attention_at, info.attention_layers) if r.rule != "softmax"), None)
    if rule is not None:
        raise NotTaken(f"model {info.name!r} has {rule} attention rows, which take no {what} (sink attention's edit)")
