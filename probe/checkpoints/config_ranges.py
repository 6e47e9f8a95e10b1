"""The one table of the config values probe reads, their kinds and their valid ranges (:data:`RANGES`), and the check
of a config against it (:func:`config_problem`). Standard library only: the coverage table's early ``--model``
check uses it without importing torch.

Each key (at any depth of nested dicts: a ``text_config``, a per-layer-type ``rope_parameters``) is checked where a
config states it; null means "not set" and is accepted, except for ``model_type``'s kind (a string). A value outside
its range is one line, ``NAME: config KEY=VALUE is not ...; choose ...``, before anything is built from it: an
out-of-range value otherwise surfaces as an internal error deep inside transformers or probe (a top-k past the
number of experts, a zero head count dividing, a rotary fraction past 1), or as silently wrong numbers (a negative
norm epsilon, a zero rotary base).

Sizes (layers, widths, heads, vocabulary, context) are integers from 1 to their kind's bound in :data:`BOUNDS`, far
beyond any released model. The one 0 a released config states is ``sliding_window`` where ``use_sliding_window``
is false (Qwen2-MoE's defaults: the window is unused); elsewhere a window of 0 is refused (HF ran such a layer
with a window of 0 while probe read it as none), and null says "no window".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# the bound of each kind of size a config states, far beyond any released model (the deepest have ~130 layers, the
# widest MLPs ~60k, vocabularies ~260k, contexts ~10M): past it a config is not a model, and building it (even
# shapes only) would take the machine's memory
BOUNDS = {"layers": 1024, "width": 2**20, "heads": 2**14, "vocabulary": 2**24, "context": 2**24}
SIZE_KEYS = {
    "layers": ("num_hidden_layers", "n_layer", "n_layers", "num_layers"),
    "width": (
        "hidden_size",
        "n_embd",
        "d_model",
        "dim",
        "intermediate_size",
        "d_mlp",
        "d_mlp_layers",
        "n_inner",
        "ffn_dim",
        "mlp_hidden_dim",
        "head_dim",
        "d_head",
        "d_value",
        "moe_intermediate_size",
        "lrid_rank",
        "lrid_projection_rank",
        "depth_rank",
    ),
    "heads": ("num_attention_heads", "n_head", "n_heads", "num_key_value_heads", "n_kv_heads", "n_local_heads"),
    "vocabulary": ("vocab_size",),
    "context": ("max_position_embeddings", "n_positions", "n_ctx", "block_size", "sliding_window"),
}
EXPERT_COUNTS = ("num_local_experts", "num_experts", "n_routed_experts")  # the number of experts, by family
NORM_EPS = ("rms_norm_eps", "layer_norm_eps", "norm_eps", "layer_norm_epsilon")
ROPE_DICTS = ("rope_scaling", "rope_parameters")  # keys of these dicts are named "rope_scaling.KEY" in RANGES


@dataclass(frozen=True)
class Range:
    """A config value's kind (``integer``, ``number`` or ``string``) and valid range: ``low`` (excluded when
    ``open_low``) to ``high``; ``at_most`` names sibling keys whose value (the first one stated) caps it;
    ``zero_when_off`` a sibling flag under which 0 is accepted too (the value is then unused); ``what`` names the
    value in the error; ``per_item``: a list of values, each checked."""

    kind: str
    what: str
    low: float | None = None
    high: float | None = None
    open_low: bool = False
    at_most: tuple[str, ...] = ()
    zero_when_off: str | None = None
    per_item: bool = False
    note: str = ""

    def holds(self, v, high=None) -> bool:
        high = self.high if high is None else high
        if self.kind == "string":
            return isinstance(v, str)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return False
        if isinstance(v, float) and not math.isfinite(v):
            return False
        if self.kind == "integer" and isinstance(v, float) and not v.is_integer():
            return False
        if self.low is not None and (v <= self.low if self.open_low else v < self.low):
            return False
        return high is None or v <= high

    def choose(self, high=None) -> str:
        """What to choose instead, in words: ``an integer 1..1,024``, ``a number in (0, 1]``, ``a string``."""
        high = self.high if high is None else high
        if self.kind == "string":
            return "a string"
        if self.kind == "integer":
            text = f"an integer {self.low:,}..{high:,}" if high is not None else f"an integer >= {self.low:,}"
        elif high is not None:
            text = f"a number in {'(' if self.open_low else '['}{self.low:g}, {high:g}]"
        else:
            text = f"a number {'>' if self.open_low else '>='} {self.low:g}"
        return text + (f" {self.note}" if self.note else "")


def _size(kind: str, key: str) -> Range:
    return Range(
        "integer",
        f"a {kind} size probe can build",
        low=1,
        high=BOUNDS[kind],
        per_item=key in ("d_mlp_layers", "intermediate_size"),  # a width per layer (Gemma 3n's intermediate_size)
        zero_when_off="use_sliding_window" if key == "sliding_window" else None,
        note=("or null for no window " if key == "sliding_window" else "")
        + "(no released model comes near that bound)",
    )


# every config key probe reads, its kind and its valid range
RANGES: dict[str, Range] = {
    **{key: _size(kind, key) for kind, keys in SIZE_KEYS.items() for key in keys},
    "model_type": Range("string", "a model type", note="(the transformers model_type)"),
    **{key: Range("integer", "a number of experts", low=1, high=BOUNDS["width"]) for key in EXPERT_COUNTS},
    "num_experts_per_tok": Range(
        "integer", "a number of experts per token", low=1, high=BOUNDS["width"], at_most=EXPERT_COUNTS
    ),
    "partial_rotary_factor": Range("number", "a fraction of each head to rotate", low=0, high=1, open_low=True),
    "query_pre_attn_scalar": Range("number", "a query scale", low=0, open_low=True),
    "rope_theta": Range("number", "a rotary base", low=0, open_low=True),
    **{key: Range("number", "a norm epsilon", low=0, high=1) for key in NORM_EPS},
    **{f"{d}.factor": Range("number", "a rope scaling factor", low=0, open_low=True) for d in ROPE_DICTS},
}


def _shown(v) -> str:
    return repr(v) if len(repr(v)) <= 40 else repr(v)[:37] + "..."


def _range_of(key: str, parents: tuple[str, ...]) -> Range | None:
    for parent in parents:
        if parent in ROPE_DICTS and f"{parent}.{key}" in RANGES:
            return RANGES[f"{parent}.{key}"]
    return RANGES.get(key)


def config_problem(config: dict, where: str = "config") -> str | None:
    """The first value of ``config`` (at any depth of nested dicts) outside its range in :data:`RANGES`, in words
    (``config KEY=VALUE is not ...; choose ...``), or None when every value holds."""
    todo = [(config, ())]
    while todo:
        d, parents = todo.pop()
        for key, value in d.items():
            if not isinstance(key, str):
                continue
            if isinstance(value, dict) and len(parents) < 5:
                todo.append((value, (*parents, key)))
            r = _range_of(key, parents)
            if r is None or (value is None and r.kind != "string"):
                continue
            if value is None:  # model_type null: the loader says what it lacks
                continue
            cap, capped_by = None, None
            for sibling in r.at_most:
                n = d.get(sibling)
                if RANGES[sibling].holds(n):
                    cap, capped_by = int(n), sibling
                    break
            for v in value if r.per_item and isinstance(value, list) else [value]:
                if r.zero_when_off and v == 0 and not isinstance(v, bool) and d.get(r.zero_when_off) is False:
                    continue
                if not r.holds(v, cap):
                    name = ".".join((*parents, key))
                    past = f" (more than {capped_by}={cap})" if cap is not None and r.holds(v) else ""
                    return f"{where} {name}={_shown(v)} is not {r.what}{past}; choose {r.choose(cap)}"
    return None


__all__ = ["BOUNDS", "EXPERT_COUNTS", "NORM_EPS", "RANGES", "Range", "SIZE_KEYS", "config_problem"]
