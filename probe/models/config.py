"""The configuration of a probe model: one HF config that selects every mechanism, its options grouped by concern.

Each group is a small dataclass whose fields are ProbeConfig keyword arguments (with their defaults and what they
mean) and whose ``check()`` refuses its own bad values: the architecture, attention and norms-and-positions groups
here; the value-gate group (gates.py), the output-gate group (out_gates.py), depth routing (depth.py) and dense
connections (dense.py) beside the registry each names from. ProbeConfig keeps every field as a flat attribute
(``config.n_heads``, ``config.value_gate``) and config.json keeps its flat format; ``config.group("depth")`` reads one
group back. `validate()` runs each group's check, then the rules across groups.

Mechanisms (docs/definitions.md#mechanisms) are orthogonal switches; `validate()` rejects combinations that make no
sense. `value_gate` names a registered gate module (gates.py), `out_gate` an output gate (out_gates.py), `depth` a
registered read (depth.py) and `dense` a registered mix (dense.py), each of which checks the settings it reads. Tiers
are named base architectures (docs/definitions.md#tiers and each paper's tables), listed in probe/catalogue.py;
`variants.py` names mechanism settings. The attention backend is not configuration: it is chosen at run time
(probe.kernels.backend).
"""

from __future__ import annotations

import inspect
from dataclasses import InitVar, dataclass, fields
from typing import ClassVar

from transformers import PretrainedConfig

from probe.catalogue import TIERS
from probe.kernels.diff_attention import SIGNED_RULES
from probe.kernels.row_rules import ROW_RULES
from probe.models.choice import check_choice
from probe.models.dense import DenseOptions
from probe.models.depth import DEPTHS, PLR_KEYS, DepthOptions
from probe.models.gates import GATES, VALUE_RESIDUALS, ValueGateOptions
from probe.models.hyper import HyperOptions
from probe.models.out_gates import OutGateOptions

__all__ = [
    "ABSTENTIONS",
    "ATTN_FNS",
    "GROUPS",
    "INITS",
    "MLPS",
    "NORMS",
    "PLR_KEYS",
    "POSITIONS",
    "QK_ACTIVATIONS",
    "ROPE_TABLES",
    "TIERS",
    "VALUE_RESIDUALS",
    "ArchitectureOptions",
    "AttentionOptions",
    "NormPositionOptions",
    "ProbeConfig",
    "tier_config",
]

ABSTENTIONS = ("none", "offbyone", "sinklogit", "sinktoken")
# the rule that turns a row's scores into its weights: "softmax", or a rule of probe.kernels.row_rules: "softpick"
# (Zuhri et al. 2025; docs/definitions.md#softpick), "sigmoid" (Ramapuram et al. 2024), "sigmoid-norm", "elu1",
# "elu1-norm" (Gu et al. 2025; docs/definitions.md#pointwise-attention-rules), "stickbreaking" (Tan et al. 2025)
ATTN_FNS = ("softmax", *ROW_RULES, *SIGNED_RULES)  # SIGNED_RULES: differential attention
QK_ACTIVATIONS = ("none", "q", "qk")
NORMS = ("rms", "layer")
POSITIONS = ("rope", "learned", "none")  # "none": no position signal (stick-breaking; FoX without RoPE)
MLPS = ("swiglu", "gelu")
# RoPE's cos/sin table: "exact" fp32 cos/sin of fp32 angles; "bfloat16" / "float16" the fp32 table (torch.polar's,
# as MUDDFormer's / MUDDPythia's precompute_freqs_cis) rounded to that dtype, as those authors' code always uses it;
# "stored" n_ctx rows held as buffers (rotary.cos / rotary.sin), loaded with the weights (LR-AttnRes keeps its table in
# its checkpoint)
ROPE_TABLES = ("exact", "bfloat16", "float16", "stored")
INITS = ("fan-in", "gpt2")


@dataclass
class ArchitectureOptions:
    """The base architecture: sizes, the MLP, biases, the residual layout, embeddings and init. Options of MUDDPythia
    (GPT-NeoX style; docs/definitions.md#released-checkpoints): d_mlp_layers, parallel_residual and the biases."""

    vocab_size: int = 8192
    n_layers: int = 6
    d_model: int = 128
    d_mlp: int = 384
    d_mlp_layers: list | None = None  # per-layer FFN widths (None: every layer d_mlp)
    n_ctx: int = 256  # context length (the learned position table's rows, RoPE's stored table's)
    mlp: str = "swiglu"  # see MLPS
    linear_bias: bool = False  # biases on the q/k/v/o projections and the MLP's linear maps
    mlp_bias: bool | None = None  # biases on the MLP's linear maps (None: as linear_bias; MUDDPythia's own flag)
    parallel_residual: bool = False  # the MLP reads the block's input, not input + attention
    tie_embeddings: bool = True  # the unembedding reuses the embedding matrix
    init: str = "fan-in"  # see INITS

    def __post_init__(self) -> None:
        self.d_mlp_layers = None if self.d_mlp_layers is None else [int(m) for m in self.d_mlp_layers]
        self.linear_bias = bool(self.linear_bias)
        self.mlp_bias = self.linear_bias if self.mlp_bias is None else bool(self.mlp_bias)
        self.parallel_residual = bool(self.parallel_residual)

    def check(self) -> None:
        check_choice("mlp", self.mlp, MLPS)
        check_choice("init", self.init, INITS)
        if self.d_mlp_layers is not None and (len(self.d_mlp_layers) != self.n_layers or min(self.d_mlp_layers) < 1):
            raise ValueError(
                f"d_mlp_layers={self.d_mlp_layers!r} must list one positive width per layer (n_layers={self.n_layers})"
            )


@dataclass
class AttentionOptions:
    """Inside a head: head counts and widths, abstention (a sink), the row rule (softmax, softpick, sigmoid, ...),
    QK-norm and GatedV's placement controls."""

    reads: ClassVar[tuple[str, ...]] = ("d_model",)  # another group's field a default here derives from

    n_heads: int = 4
    n_kv_heads: int | None = None  # KV heads (grouped-query attention); None: n_heads
    d_head: int | None = None  # None: d_model // n_heads
    d_value: int | None = None  # per-head value width (GLU reduced width); None: d_head
    abstention: str = "none"  # see ABSTENTIONS
    qk_norm: bool = False  # RMS-normalise each head's query and key
    qk_activation: str = "none"  # GatedV placement controls: SiLU on q (or q and k) before RoPE; see QK_ACTIVATIONS
    attn_fn: str = "softmax"  # see ATTN_FNS; a config.json without the field is softmax
    forget_gate: bool = False  # FoX: f_t = σ(w_h·x_t + b_h) per KV head, Σ log f on the logits; see definitions.md
    d_model: InitVar[int | None] = None  # the architecture's width, read for d_head's default (not a field here)

    def __post_init__(self, d_model: int | None) -> None:
        self.n_kv_heads = self.n_kv_heads or self.n_heads
        if not self.d_head:
            if d_model is None:
                raise ValueError("d_head=None derives from d_model; pass d_model or d_head")
            self.d_head = d_model // self.n_heads
        self.d_value = self.d_value or self.d_head

    def check(self) -> None:
        check_choice("abstention", self.abstention, ABSTENTIONS)
        check_choice("qk_activation", self.qk_activation, QK_ACTIVATIONS)
        check_choice("attn_fn", self.attn_fn, ATTN_FNS)
        if self.attn_fn != "softmax" and self.abstention in ("offbyone", "sinklogit"):
            raise ValueError(
                f"attn_fn={self.attn_fn!r} does not compose with abstention={self.abstention!r} (a phantom key)"
            )
        assert self.n_kv_heads is not None  # __post_init__ set it
        if self.forget_gate:
            self._check_forget_gate()
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} must be a multiple of n_kv_heads={self.n_kv_heads}")

    def _check_forget_gate(self) -> None:
        """FoX's bias -c_j stands for c_i - c_j only where a row-constant shift changes nothing: softmax rows over
        real keys."""
        if self.attn_fn != "softmax":
            raise ValueError(
                f"forget_gate needs attn_fn='softmax' (its bias drops a per-row constant); got {self.attn_fn!r}"
            )
        if self.abstention in ("offbyone", "sinklogit"):
            raise ValueError(
                f"forget_gate does not compose with abstention={self.abstention!r}: a phantom key's logit does not "
                "take the row's cumulative log forget gate; choose none or sinktoken"
            )


@dataclass
class NormPositionOptions:
    """Norms and positions: the norm layers, the position scheme and RoPE's options."""

    norm: str = "rms"  # see NORMS
    norm_eps: float = 1e-6
    norm_bias: bool = False  # LayerNorm with a bias (norm="layer")
    pos: str = "rope"  # see POSITIONS
    rope_theta: float = 10000.0
    rope_table: str = "exact"  # see ROPE_TABLES
    rotary_dims: int | None = None  # RoPE on the first rotary_dims of each head only (None: all of d_head)
    strict_ctx: bool = False  # refuse sequences longer than n_ctx (an authors' model their code cannot run past)

    def __post_init__(self) -> None:
        self.norm_bias = bool(self.norm_bias)
        self.rotary_dims = None if self.rotary_dims is None else int(self.rotary_dims)
        self.strict_ctx = bool(self.strict_ctx)

    def check(self) -> None:
        check_choice("norm", self.norm, NORMS)
        check_choice("pos", self.pos, POSITIONS)
        check_choice("rope_table", self.rope_table, ROPE_TABLES)
        if self.rope_table != "exact" and self.pos != "rope":
            raise ValueError(f"rope_table={self.rope_table!r} needs pos='rope'; got pos={self.pos!r}")
        if self.norm_bias and self.norm != "layer":
            raise ValueError(f"norm_bias=True needs norm='layer'; got norm={self.norm!r}")


# name -> group, in the order ProbeConfig builds them; every ProbeConfig keyword argument is a field of exactly one
GROUPS: dict[str, type] = {
    "architecture": ArchitectureOptions,
    "attention": AttentionOptions,
    "norm_position": NormPositionOptions,
    "value_gate": ValueGateOptions,
    "out_gate": OutGateOptions,
    "depth": DepthOptions,
    "dense": DenseOptions,
    "hyper": HyperOptions,
}


def _build(group: type, values: dict):
    """``group`` from ``values`` (every group's field by name): its own fields, and the fields it ``reads``."""
    names = [f.name for f in fields(group)] + list(getattr(group, "reads", ()))
    return group(**{name: values[name] for name in names})


def _signature() -> inspect.Signature:
    """ProbeConfig's keyword arguments, read off the groups (inspect and help() show them as before)."""
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    for group in GROUPS.values():
        params += [
            inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type)
            for f in fields(group)
        ]
    return inspect.Signature([*params, inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)])


class ProbeConfig(PretrainedConfig):
    model_type = "probe"

    def __init__(self, **kwargs):
        """Every field of every group in GROUPS by keyword (a missing one takes the group's default), and HF's own
        keyword arguments."""
        values = {f.name: kwargs.pop(f.name, f.default) for group in GROUPS.values() for f in fields(group)}
        for group in GROUPS.values():
            built = _build(group, values)
            for f in fields(built):
                setattr(self, f.name, getattr(built, f.name))
        # config.json files saved before the backend became a runtime choice carry it; it is a runtime choice now
        kwargs.pop("backend", None)
        kwargs.setdefault("tie_word_embeddings", False)  # tying is done by reusing the embedding matrix
        super().__init__(**kwargs)
        self.validate()

    __init__.__signature__ = _signature()  # type: ignore[attr-defined]

    def group(self, name: str):
        """The group ``name`` of GROUPS (a new dataclass) holding this config's current values of its fields."""
        if name not in GROUPS:
            raise ValueError(f"group={name!r} is not valid; choose one of {', '.join(GROUPS)}")
        values = {f.name: getattr(self, f.name) for f in fields(GROUPS[name])}
        values.update({field: getattr(self, field) for field in getattr(GROUPS[name], "reads", ())})
        return GROUPS[name](**values)

    @classmethod
    def from_dict(cls, config_dict, **kwargs):
        """A saved config.json without ``plr_key`` was trained with raw-sum P-LR keys: it loads as "raw"."""
        if "plr_key" not in config_dict and "plr_key" not in kwargs:
            config_dict = {**config_dict, "plr_key": "raw"}
        return super().from_dict(config_dict, **kwargs)

    @classmethod
    def from_json_file(cls, json_file):
        return cls.from_dict(cls._dict_from_json_file(json_file))

    # HF generic names, so generic tooling (nnsight, generation utils) finds them
    @property
    def hidden_size(self) -> int:
        return self.d_model

    @property
    def num_hidden_layers(self) -> int:
        return self.n_layers

    @property
    def num_attention_heads(self) -> int:
        return self.n_heads

    @property
    def max_position_embeddings(self) -> int:
        return self.n_ctx

    def layer_d_mlp(self, layer: int) -> int:
        """The FFN width of block ``layer`` (d_mlp unless d_mlp_layers gives one per layer)."""
        return self.d_mlp_layers[layer] if self.d_mlp_layers else self.d_mlp

    @property
    def has_phantom(self) -> bool:
        return self.abstention in ("offbyone", "sinklogit")

    def validate(self) -> None:
        """Each group's own check, then the rules across groups."""
        for name in GROUPS:
            self.group(name).check()
        if self.depth != "residual":
            DEPTHS[self.depth].check(self)
            if self.depth_blocks and (2 * self.n_layers) % self.depth_blocks:
                raise ValueError(f"depth_blocks={self.depth_blocks} must divide 2L={2 * self.n_layers} sub-layers")
        if self.depth != "residual" and self.dense != "none":
            raise ValueError(
                f"depth={self.depth!r} and dense={self.dense!r} both replace the residual stream; pick one"
            )
        if self.hyper != "none" and (self.depth != "residual" or self.dense != "none"):
            other = f"depth={self.depth!r}" if self.depth != "residual" else f"dense={self.dense!r}"
            raise ValueError(f"{other} and hyper={self.hyper!r} both replace the residual stream; pick one")
        if self.parallel_residual and (self.depth != "residual" or self.hyper != "none"):
            which = f"depth={self.depth!r}" if self.depth != "residual" else f"hyper={self.hyper!r}"
            raise ValueError(f"parallel_residual=True needs the plain or dense residual stream; got {which}")
        gate = GATES.get(self.value_gate)
        if self.attn_fn != "softmax" and gate is not None and gate.routing:
            raise ValueError(
                f"attn_fn={self.attn_fn!r} does not compose with value_gate={self.value_gate!r} (a routing-slot gate)"
            )
        if self.rotary_dims is not None and not (0 < self.rotary_dims <= self.d_head and self.rotary_dims % 2 == 0):
            raise ValueError(f"rotary_dims={self.rotary_dims!r} must be even and in 2..d_head={self.d_head}")


def tier_config(tier: str) -> dict:
    if tier not in TIERS:
        raise ValueError(f"unknown tier {tier!r}; choose one of {', '.join(TIERS)}")
    return dict(TIERS[tier])
