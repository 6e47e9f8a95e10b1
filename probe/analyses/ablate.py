"""Causal interventions on sinks, phantoms, gates and depth routes, as loss changes (docs/definitions.md#ablations).

Each intervention is a set of forward hooks (hook names from probe.hooks.names); its outcome is the change in
next-token loss per token, ablated − clean, paired on the same windows, with standard errors over batches:

    knockout   key 0 leaves every query's softmax (rows renormalise over the other keys and the phantom; query 0 of a
               head without a phantom keeps its clean row), by the attention op's own per-key bias: an edit armed at
               hook_v_out for the layer's op (probe.kernels.sink_attention.edits). Key 0 is the window's first
               position (the learned sink token of the sinktoken variant).
    value      v_0 at hook_v set to zero, to the mean of its KV head's reads over positions 1 .. T-1 of the same
               window, or to the read at position 1 (zero | mean | swap); a value gate sees the edited read.
    phantom    the phantom logit at hook_sink_logit removed (-inf: plain softmax) or fixed (sink-logit c); models
               without a phantom are refused.
    gate       a scalar value gate at hook_v_gate held open (g = 1), closed (g = 0) or at its mean per layer and KV
               head over the clean pass of the same windows. A routing-slot gate (ModelInfo.gate_on_logits) closed
               removes every key from the softmax, as the knockout does key 0: rows without a phantom keep their
               clean row, rows with one go to the phantom (value 0). Element-wise value gates are refused. An output
               gate (hook_out_gate, G1; headwise or element-wise) is held the same way, its mean per layer, head
               (and coordinate); a model with both gates has both held.
    evict      window eviction (StreamingLLM): query t sees keys 0 .. k-1 and t-w+1 .. t, in every layer, carried out
               by the attention op (probe.kernels.sink_attention.edits), keys at their positions in the text
               (``k=K,w=W``) or within the cache as StreamingLLM assigns them (``k=K,w=W,pos=cache``: rotary models,
               the queries re-rotated by each layer's own rotary); loss over all queries and over queries t >= k + w.
    depth      a depth read site's weights (hook_depth_weights over sub-layer sources; DenseFormer / MUDD
               dense.hook_weights over block states) forced to the uniform mix, to the standard residual (weight 1
               on every sub-layer source; one-hot on the latest block state for dense mixes), or, for sub-layer
               sources, with one source category dropped (embed / blocks / partial) and the rest renormalised.

Local interventions run on every layer at once (scope "model") and one layer at a time ("layer"; "head": one KV
head, or one query head for phantom edits, with ``per_head``); depth forcings on every site at once and per site.
Mechanisms are found by what the model does (its capabilities and the hooks that fire), never by its name.
A model with linear layers (no softmax attention, docs/definitions.md#layer-types) is ablated in its softmax layers,
which ``meta`` lists (``softmax_layers``, ``linear_layers``): "every layer at once" is every softmax layer, and an
eviction leaves a linear layer's state whole. Its ``results`` get a ``layer_type`` column after ``layer`` and, with
``per_layer``, a row per linear layer and intervention with NaN losses.
Cost: one clean forward per batch plus one forward per condition and batch, then the cost measurement (one warm-up
pair and COST_REPEATS timed pairs of a clean and an ablated forward on one batch; ``cost_summary``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pandas as pd
import torch

from probe.analyses.capture import (
    as_windows,
    describe,
    finish,
    loss_forward_kwargs,
    make_bar,
    model_device,
    output_losses,
    require,
)
from probe.analyses.layer_types import layer_meta, linear_layers, with_linear_layers
from probe.analyses.parallel import all_sum, gather, gather_rows
from probe.analyses.stats import with_batch_se
from probe.hooks import names
from probe.kernels.sink_attention import edits
from probe.process_group import batches_of_rank, is_main

INTERVENTIONS = ("knockout", "value", "phantom", "gate", "evict", "depth")
VALUE_MODES = ("zero", "mean", "swap")
GATE_MODES = ("open", "closed", "mean")
DEPTH_MODES = ("uniform", "residual", "drop")
SOURCE_CATEGORIES = ("embed", "blocks", "partial")
DEFAULT_KEEP = (0, 1, 4)
COST_REPEATS = 5  # timed clean / ablated pairs after one warm-up pair (docs/definitions.md#ablations)
COST_SPREAD = 0.25  # the cost ratio is stated when its interquartile range is at most this fraction of its median
DEFAULT_WINDOWS = (64,)
POSITIONS = edits.POSITIONS  # eviction: keys at their positions in the text, or within the cache
MAX_SINK_LOGIT = 1e4  # a fixed phantom logit beyond +-1e4 is an infinite one for the softmax (and past fp16's range)
MAX_POSITIONS = 2**31 - 1  # kept keys and eviction windows: positions, far beyond any context


@dataclass(frozen=True)
class Ablation:
    """One condition: an intervention, its setting, and where (every layer / site, or one)."""

    intervention: str  # one of INTERVENTIONS
    # key0 | zero | mean | swap | remove | logit=c | open | closed | k=K,w=W | uniform | residual | drop:cat
    setting: str
    layer: int | None = None  # None: every layer at once
    head: int | None = None  # a KV head (a query head for phantom edits)
    site: str | None = None  # a depth read site (None: every site)

    @property
    def scope(self) -> str:
        if self.site is not None:
            return "site"
        return "head" if self.head is not None else ("layer" if self.layer is not None else "model")


class AblationError(ValueError):
    """An intervention the model cannot take (one line naming the model and what it lacks)."""


# --- what the model has ----------------------------------------------------------------------------------------


@dataclass
class Mechanisms:
    gate_dims: int | None  # 3: scalar gates (B,T,Hkv), 4: element-wise, None: no gate fired
    depth_sites: list[str]  # sub-layer depth read sites (hook prefixes) that fired
    dense_layers: list[int]  # layers with a DenseFormer / MUDD mix that fired
    out_gate: bool = False  # an output gate fired (hook_out_gate)


GATE_POINTS = ("v_gate", "out_gate")  # the gates a clamp holds


def find_mechanisms(model, ids: torch.Tensor) -> Mechanisms:
    """One short forward (a few tokens of one window) records which gate and depth hooks fire and their shapes."""
    seen: dict[str, tuple] = {}

    def record(x, hook):
        seen[hook.name] = tuple(x.shape)

    points = getattr(model, "hook_dict", {})
    wanted = [
        n for n in points if names.is_attn(n, *GATE_POINTS) or names.is_depth_weights(n) or names.is_dense_weights(n)
    ]
    if wanted:
        model.run_with_hooks(
            ids[:1, : min(ids.shape[1], 8)], fwd_hooks=[(n, record) for n in wanted], **loss_forward_kwargs(model)
        )
    gates = [len(s) for n, s in seen.items() if names.attn_point(n) == "v_gate"]
    sites = [names.site_of(n) for n in seen if names.is_depth_weights(n)]
    dense = sorted(names.layer_of(n) for n in seen if names.is_dense_weights(n))
    out_gate = any(names.attn_point(n) == "out_gate" for n in seen)
    return Mechanisms(max(gates) if gates else None, sites, dense, out_gate)


def source_labels(model, site: str) -> list[str]:
    """The source slots a sub-layer depth read site reads ('embed', 'attn3', 'block2', 'partial', ...)."""
    labels = model.probe_info.extra.get("depth_sites")
    if labels is None:
        from probe.models.depth import site_sources  # probe's own depth-routed models

        labels = site_sources(model.config)
    return list(labels[site])


def category(label: str) -> str:
    """A source slot's category: embed, blocks (a completed block, or a sub-layer output in full mode) or partial."""
    return label if label in ("embed", "partial") else "blocks"


# --- the conditions --------------------------------------------------------------------------------------------


def plan(
    model,
    mech: Mechanisms,
    interventions,
    *,
    value_modes=("zero", "mean"),
    sink_logits=(),
    gate_modes=GATE_MODES,
    keep=DEFAULT_KEEP,
    windows=DEFAULT_WINDOWS,
    positions=("original",),
    depth_modes=DEPTH_MODES,
    per_layer: bool = True,
    per_head: bool = False,
    ctx: int | None = None,
) -> list[Ablation]:
    """Every condition of the requested interventions, validated against the model; AblationError on one it
    cannot take."""
    info = model.probe_info
    H, Hkv = info.n_heads, info.n_kv_heads
    out: list[Ablation] = []

    def local(intervention, setting, n_heads):
        out.append(Ablation(intervention, setting))
        for l in info.attention_layers if per_layer or per_head else ():
            if per_layer:
                out.append(Ablation(intervention, setting, l))
            for h in range(n_heads) if per_head else ():
                out.append(Ablation(intervention, setting, l, h))

    for name in dict.fromkeys(interventions):
        if name not in INTERVENTIONS:
            raise AblationError(f"unknown intervention {name!r}; choose from {', '.join(INTERVENTIONS)}")
        if name == "knockout":
            local("knockout", "key0", Hkv)
        elif name == "value":
            for mode in dict.fromkeys(value_modes):
                if mode not in VALUE_MODES:
                    raise AblationError(f"unknown value ablation {mode!r}; choose from {', '.join(VALUE_MODES)}")
                local("value", mode, Hkv)
        elif name == "phantom":
            if not info.has_phantom:
                raise AblationError(
                    f"model {info.name!r} has no phantom key (off-by-one, sink logit or gpt-oss "
                    "sinks): phantom edits need one"
                )
            for c in dict.fromkeys(sink_logits):
                if not isinstance(c, (int, float)) or not abs(c) <= MAX_SINK_LOGIT:
                    raise AblationError(
                        f"sink logit {c!r} is not a finite number within +-{MAX_SINK_LOGIT:g} (the phantom's "
                        "removal is -inf)"
                    )
            for setting in ["remove"] + [f"logit={float(c):g}" for c in dict.fromkeys(sink_logits)]:
                local("phantom", setting, H)
        elif name == "gate":
            if mech.gate_dims is None and not mech.out_gate:
                raise AblationError(
                    f"model {info.name!r} has no value gate or output gate (no hook_v_gate or hook_out_gate "
                    "fires): gate clamps need a scalar value gate or an output gate"
                )
            if mech.gate_dims not in (None, 3):
                raise AblationError(
                    f"model {info.name!r} has an element-wise value gate (GatedV, GLU: one g per "
                    "value coordinate); gate clamps take scalar gates (one g per key and KV head)"
                )
            for mode in dict.fromkeys(gate_modes):
                if mode not in GATE_MODES:
                    raise AblationError(f"unknown gate clamp {mode!r}; choose from {', '.join(GATE_MODES)}")
                local("gate", mode, Hkv if mech.gate_dims else H)
        elif name == "evict":
            for pos in dict.fromkeys(positions):
                check_positions(model, pos)
                for w in dict.fromkeys(windows):
                    if not _whole(w, 1):
                        raise AblationError(f"eviction window must be an int 1..{MAX_POSITIONS}, got {w!r}")
                    for k in dict.fromkeys(keep):
                        if not _whole(k, 0):
                            raise AblationError(f"kept first keys must be an int 0..{MAX_POSITIONS}, got {k!r}")
                        out.append(Ablation("evict", eviction_setting(int(k), int(w), pos)))
        elif name == "depth":
            out += _depth_conditions(model, mech, depth_modes, per_layer)
    return out


def _depth_conditions(model, mech: Mechanisms, depth_modes, per_layer: bool) -> list[Ablation]:
    """The depth-route forcings the model's read sites take: each mode at every site that takes it (drop per source
    category, on sub-layer sources only); AblationError when none is taken anywhere."""
    info = model.probe_info
    if not mech.depth_sites and not mech.dense_layers:
        raise AblationError(
            f"model {info.name!r} has no depth routing (no depth-routing or dense "
            "mixing weights fire): depth-route ablations need AttnRes, S-LR, P-LR, "
            "DenseFormer or MUDD"
        )
    out: list[Ablation] = []
    for mode in dict.fromkeys(depth_modes):
        if mode not in DEPTH_MODES:
            raise AblationError(f"unknown depth forcing {mode!r}; choose from {', '.join(DEPTH_MODES)}")
        settings = [mode] if mode != "drop" else [f"drop:{c}" for c in SOURCE_CATEGORIES]
        for setting in settings:
            if setting.startswith("drop:") and not mech.depth_sites:
                continue  # dense mixes take the two forcings only
            sites = [s for s in _depth_targets(mech) if _site_takes(model, s, setting)]
            if not sites:
                continue
            out.append(Ablation("depth", setting))
            out += [Ablation("depth", setting, site=s) for s in sites] if per_layer else []
    if not out:
        takes = "uniform, residual" if not mech.depth_sites else "uniform, residual, drop"
        raise AblationError(
            f"model {info.name!r} takes no depth forcing of {', '.join(dict.fromkeys(depth_modes))} at any "
            f"read site (drop needs sub-layer sources with another category left; DenseFormer / MUDD "
            f"mixes of block states take uniform and residual); choose from {takes}"
        )
    return out


def eviction_setting(keep: int, window: int, positions: str = "original") -> str:
    """An eviction's setting: ``k=K,w=W`` (keys at their positions in the text) or ``k=K,w=W,pos=cache``."""
    return f"k={keep},w={window}" + ("" if positions == "original" else f",pos={positions}")


def parse_eviction(setting: str) -> tuple[int, int, str]:
    """(keep, window, positions) of an eviction's setting."""
    parts = dict(part.split("=", 1) for part in setting.split(","))
    return int(parts["k"]), int(parts["w"]), parts.get("pos", "original")


def check_positions(model, positions: str) -> None:
    """Eviction positions the model can take: within the cache needs a rotary position embedding in every layer
    (``model.rotary_tables``); else one AblationError line."""
    if positions not in POSITIONS:
        raise AblationError(f"unknown eviction positions {positions!r}; choose from {', '.join(POSITIONS)}")
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


def _whole(x, low: int) -> bool:
    """An int-valued number in low..MAX_POSITIONS."""
    number = isinstance(x, (int, float)) and not isinstance(x, bool)
    return number and low <= x <= MAX_POSITIONS and int(x) == x  # NaN fails the comparison


def _depth_targets(mech: Mechanisms) -> list[str]:
    return mech.depth_sites + [names.block(l) + ".dense" for l in mech.dense_layers]


def _site_takes(model, site: str, setting: str) -> bool:
    """Dense mixes take uniform / residual; a drop needs the category present and something left after it."""
    if site.endswith(".dense"):
        return not setting.startswith("drop:")
    if not setting.startswith("drop:"):
        return True
    cats = [category(lab) for lab in source_labels(model, site)]
    drop = setting.split(":", 1)[1]
    return drop in cats and any(c != drop for c in cats)


# --- the hooks -------------------------------------------------------------------------------------------------


def _layers(abl: Ablation, info) -> list[int]:
    return info.attention_layers if abl.layer is None else [abl.layer]


def check_target(abl: Ablation, info) -> None:
    """The layer and head of a condition exist in the model, for every kind alike (heads: query heads for phantom
    edits and a model's only gate being an output gate, KV heads otherwise); else one AblationError line naming the
    valid range."""
    query_heads = abl.intervention == "phantom" or (
        abl.intervention == "gate" and info.has_out_gate and not info.has_value_gate
    )  # phantom logits and output gates are per query head
    n_heads = info.n_heads if query_heads else info.n_kv_heads
    what = "query heads" if query_heads else "KV heads"
    for name, value, n in (("layer", abl.layer, info.n_layers), ("head", abl.head, n_heads)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < n):
            extra = f" ({what})" if name == "head" else ""
            raise AblationError(
                f"{abl.intervention} ablation: {name} {value!r} is not in model {info.name!r}, which has "
                f"{name}s 0..{n - 1}{extra}"
            )
    if abl.head is not None and abl.intervention in ("evict", "depth"):
        raise AblationError(f"{abl.intervention} ablation: takes no head (it acts on every head of a layer or site)")
    if abl.layer is not None and abl.layer not in info.attention_layers and abl.intervention != "depth":
        raise AblationError(
            f"{abl.intervention} ablation: layer {abl.layer} of model {info.name!r} is a linear layer (no softmax "
            f"attention, hence no key 0, reads, phantom or gate to edit); its softmax layers: {info.attention_layers}"
        )


def ablation_hooks(
    model, abl: Ablation, mech: Mechanisms | None = None, gate_means: dict[str, torch.Tensor] | None = None
) -> list:
    """The (hook name, fn) pairs that carry out one condition (``model.run_with_hooks`` inside edits.armed())."""
    info = model.probe_info
    check_target(abl, info)
    layers = _layers(abl, info)
    kind, setting = abl.intervention, abl.setting
    if kind in ("knockout", "evict"):
        if kind == "knockout":
            edit = edits.AttentionEdit(knockout=True, kv_heads=None if abl.head is None else (abl.head,))
        else:
            k, w, pos = parse_eviction(setting)
            edit = edits.AttentionEdit(keep=k, window=w)

        def arm(v, hook):  # B,T,Hkv,dv
            if kind == "evict" and pos == "cache":  # the layer's own rotary at positions 0 .. T-1
                tables = model.rotary_tables(names.layer_of(hook.name), v.shape[1], v.device)
                edits.arm(edits.AttentionEdit(keep=k, window=w, positions="cache", rotary=tables))
            else:
                edits.arm(edit)

        return [(names.attn(l, "v_out"), arm) for l in layers]
    if kind == "value":

        def value(v, hook):  # B,T,Hkv,dv
            heads = slice(None) if abl.head is None else slice(abl.head, abl.head + 1)
            new = {
                "zero": lambda: torch.zeros_like(v[:, 0]),
                "mean": lambda: v[:, 1:].mean(1),
                "swap": lambda: v[:, 1],
            }[setting]()
            v = v.clone()
            v[:, 0, heads] = new[:, heads]
            return v

        return [(names.attn(l, "v"), value) for l in layers]
    if kind == "phantom":
        logit = float("-inf") if setting == "remove" else float(setting.split("=", 1)[1])

        def phantom(sink, hook):  # H
            sink = sink.clone()
            sink[slice(None) if abl.head is None else abl.head] = logit
            return sink

        return [(names.attn(l, "sink_logit"), phantom) for l in layers]
    if kind == "gate":
        return _gate_hooks(abl, info, layers, gate_means)
    if kind == "depth":
        mech = mech if mech is not None else find_mechanisms(model, torch.zeros(1, 2, dtype=torch.long))
        targets = _depth_targets(mech)
        if abl.site is not None and abl.site not in targets:
            raise AblationError(
                f"depth ablation: read site {abl.site!r} is not in model {info.name!r}; its sites: "
                f"{', '.join(targets) or 'none'}"
            )
        return _depth_hooks(model, setting, [abl.site] if abl.site is not None else targets)
    raise AblationError(f"unknown intervention {kind!r}")


def _gate_hooks(abl: Ablation, info, layers: list[int], gate_means: dict | None) -> list:
    """A gate clamp: every value gate (hook_v_gate) and output gate (hook_out_gate) of the chosen layers held open,
    closed or at its clean-pass mean. ``abl.head``: a KV head (and, with an output gate too, the output gates of its
    query heads), or a query head when the output gate is the model's only gate."""
    setting = abl.setting

    def held(heads):
        def gate(g, hook):  # B,T,Hkv (value) or B,T,H / B,T,H,dv (output)
            value = {
                "open": lambda: torch.ones_like(g),
                "closed": lambda: torch.zeros_like(g),
                "mean": lambda: gate_means[hook.name].to(g.device, g.dtype).expand_as(g),
            }[setting]()
            if heads is None:
                return value
            g = g.clone()
            g[:, :, heads] = value[:, :, heads]
            return g

        return gate

    one = None if abl.head is None else slice(abl.head, abl.head + 1)
    group = None if abl.head is None else slice(abl.head * info.kv_group, (abl.head + 1) * info.kv_group)
    out_heads = group if info.has_value_gate else one
    hooks = [(names.attn(l, "out_gate"), held(out_heads)) for l in layers] if info.has_out_gate else []
    gate = held(one)
    if not info.has_value_gate:
        return hooks
    if setting == "closed" and info.gate_on_logits:
        # routing slot: every key leaves the softmax. A row without a phantom would see nothing and keeps its clean
        # row (no hook); a row with one puts all its mass there, whose value is 0: the same as zero values.
        if not info.has_phantom:
            return hooks

        def to_phantom(v, hook):  # B,T,Hkv,dv
            v = v.clone()
            v[:, :, slice(None) if abl.head is None else slice(abl.head, abl.head + 1)] = 0
            return v

        return hooks + [(names.attn(l, "v_out"), to_phantom) for l in layers]
    return hooks + [(names.attn(l, "v_gate"), gate) for l in layers]


def _depth_hooks(model, setting: str, sites: list[str]) -> list:
    hooks = []
    for site in sites:
        if not _site_takes(model, site, setting):
            continue
        if site.endswith(".dense"):

            def dense(w, hook):  # B,T,C,S
                if setting == "uniform":
                    return torch.full_like(w, 1.0 / w.shape[-1])
                one_hot = torch.zeros_like(w)
                one_hot[..., -1] = 1.0  # the latest block state: a plain residual stream
                return one_hot

            layer = names.layer_of(site)
            assert layer is not None  # a dense site is blocks.<l>.dense
            hooks.append((names.dense(layer), dense))
            continue
        drop = (
            [category(lab) == setting.split(":", 1)[1] for lab in source_labels(model, site)]
            if setting.startswith("drop:")
            else None
        )

        def depth(w, hook, drop=drop):  # B,T,S
            if setting == "uniform":
                return torch.full_like(w, 1.0 / w.shape[-1])
            if setting == "residual":
                return torch.ones_like(w)
            kept = w.masked_fill(torch.tensor(drop, device=w.device), 0.0)
            return kept / kept.sum(-1, keepdim=True)

        hooks.append((names.depth_weights(site), depth))
    return hooks


# --- the run ---------------------------------------------------------------------------------------------------


def _gate_collector(sums: dict, counts: dict):
    """Per gate hook name, the sums of g over windows and positions ((Hkv,), (H,) or (H, dv)) and their count."""

    def fn(g, hook):
        sums[hook.name] = sums.get(hook.name, 0) + g.detach().double().sum((0, 1)).cpu()
        counts[hook.name] = counts.get(hook.name, 0) + g.shape[0] * g.shape[1]

    return [(lambda name: names.is_attn(name, *GATE_POINTS), fn)]


def _late_mask(abl: Ablation, T: int) -> torch.Tensor | None:
    """Eviction: the queries t >= k + w (None for other interventions)."""
    if abl.intervention != "evict":
        return None
    k, w, _ = parse_eviction(abl.setting)
    return torch.arange(T) >= min(k + w, T)


@torch.no_grad()
def ablate(
    model,
    data,
    interventions=("knockout", "value"),
    *,
    value_modes=("zero", "mean"),
    sink_logits=(),
    gate_modes=GATE_MODES,
    keep=DEFAULT_KEEP,
    windows=DEFAULT_WINDOWS,
    positions=("original",),
    depth_modes=DEPTH_MODES,
    per_layer: bool = True,
    per_head: bool = False,
    progress: bool = True,
) -> dict[str, pd.DataFrame]:
    """Loss change per condition: tables ``results`` (loss_clean, loss_ablated, delta, delta_se; eviction also over
    queries t >= k + w: *_late; cost_ratio: the median over batches of the condition's forward time over the measured
    clean forward's), ``per_batch`` and ``meta`` (with the measured cost: :func:`cost_summary`); linear layers: the
    module docstring.

    Tables (columns):

    - ``results``: model, corpus, intervention, setting, scope, layer, head, site, loss_clean, loss_ablated, delta,
      delta_se, n_batches, cost_ratio
    - ``per_batch``: model, corpus, batch, intervention, setting, scope, layer, head, site, n_tokens, clean_sum,
      ablated_sum, delta, forward_s
    """
    info = model.probe_info
    require(model, [names.attn(l, "v_out") for l in info.attention_layers], "ablations")
    w = as_windows(data)
    T = w.tokens.shape[-1] - 1
    if T < 2:
        raise AblationError(f"ablations need windows of at least 2 tokens, got {T}")
    device = model_device(model)
    mech = find_mechanisms(model, w.inputs(0, device))
    conds = plan(
        model,
        mech,
        interventions,
        value_modes=value_modes,
        sink_logits=sink_logits,
        gate_modes=gate_modes,
        keep=keep,
        windows=windows,
        positions=positions,
        depth_modes=depth_modes,
        per_layer=per_layer,
        per_head=per_head,
    )
    kw = loss_forward_kwargs(model)
    mine = batches_of_rank(len(w))
    want_means = any(c.intervention == "gate" and c.setting == "mean" for c in conds)

    clean, clean_times, gate_means = _clean_pass(model, w, mine, device, kw, want_means)
    clean_s = sum(clean_times)
    rows = []
    bar = make_bar(len(mine) * len(conds), progress and is_main(), f"ablations ({info.name})")
    t0 = time.perf_counter()
    for n in mine:
        ids, tgt = w.inputs(n, device), w.targets(n, device)
        for c in conds:
            t1 = time.perf_counter()
            with edits.armed():
                out = model.run_with_hooks(ids, fwd_hooks=ablation_hooks(model, c, mech, gate_means), **kw)
            lost = output_losses(model, out, tgt).double().cpu()
            rows.append({**_row(c, n, clean[n], lost, _late_mask(c, T)), "forward_s": time.perf_counter() - t1})
            bar.update()
    bar.close()
    ablated_s = time.perf_counter() - t0
    pairs = _timed_pairs(model, w, mine[0], conds[0], mech, gate_means, device, kw) if mine and conds else ([], [])
    rows = gather_rows(rows)
    timed = gather(pairs)  # every rank's (clean times, ablated times)
    timed_clean: list[float] = [t for c, _ in timed for t in c]
    timed_ablated: list[float] = [t for _, a in timed for t in a]
    cost = cost_summary(timed_clean, timed_ablated)
    clean_s, ablated_s = all_sum(clean_s), all_sum(ablated_s)
    per_batch = pd.DataFrame(rows)
    results = _results(per_batch)
    # per row: the median over batches of its one timed forward per batch, over the measured clean forward
    per_row = per_batch.groupby(KEYS, sort=False)["forward_s"].median() / cost["clean_forward_s"]
    results = results.merge(per_row.rename("cost_ratio").reset_index(), on=KEYS, how="left")
    results = _with_linear_layers(results, info)
    kinds = set(c.intervention for c in conds)
    meta = describe(
        model,
        w,
        "ablate",
        interventions=",".join(dict.fromkeys(c.intervention for c in conds)),
        per_layer=per_layer,
        per_head=per_head,
        n_conditions=len(conds),
        n_tokens=int(w.tokens[..., 1:].numel()),
        knockout_query0="clean row kept where the head has no phantom" if "knockout" in kinds else "n/a",
        eviction_positions=",".join(dict.fromkeys(positions)) if "evict" in kinds else "n/a",
        gate_means="clean pass" if want_means else "n/a",
        **cost,
        wall_s=clean_s + ablated_s,
        **layer_meta(info),  # a hybrid's interventions act on its softmax layers
    )
    return finish({"results": results, "per_batch": per_batch}, meta)


_clock = time.perf_counter  # the cost measurement's clock (tests replace it)


def _timed_pairs(model, w, n: int, cond, mech, gate_means, device, kw, repeats: int = COST_REPEATS):
    """(clean times, ablated times): one untimed warm-up pair, then ``repeats`` pairs of forwards (each with its loss,
    read back to the CPU) on batch ``n``, clean and ablated interleaved, the order alternating (ABBA) so that a drift
    in speed falls on both alike."""
    ids, tgt = w.inputs(n, device), w.targets(n, device)

    def clean():
        output_losses(model, model.run_with_hooks(ids, fwd_hooks=[], **kw), tgt).double().cpu()

    def ablated():
        with edits.armed():
            out = model.run_with_hooks(ids, fwd_hooks=ablation_hooks(model, cond, mech, gate_means), **kw)
        output_losses(model, out, tgt).double().cpu()

    clean()
    ablated()
    times: dict = {clean: [], ablated: []}
    for r in range(repeats):
        for forward in (clean, ablated) if r % 2 == 0 else (ablated, clean):
            t0 = _clock()
            forward()
            times[forward].append(_clock() - t0)
    return times[clean], times[ablated]


def cost_summary(clean_s, ablated_s, spread: float = COST_SPREAD) -> dict:
    """The cost ``meta`` of timed pairs (docs/definitions.md#ablations): the median clean and ablated forward times,
    the median and quartiles of the per-pair ratio ablated / clean, the number of pairs, and whether the ratio is
    stated: its interquartile range at most ``spread`` of its median (no pairs: NaN, not stated)."""
    ratios = torch.tensor([a / c if c > 0 else float("nan") for c, a in zip(clean_s, ablated_s)], dtype=torch.float64)
    if not len(ratios) or ratios.isnan().any():
        keys = ("clean_forward_s", "ablated_forward_s", "cost_ratio", "cost_ratio_q1", "cost_ratio_q3")
        return {**dict.fromkeys(keys, float("nan")), "cost_repeats": len(ratios), "cost_stated": False}
    q1, med, q3 = torch.quantile(ratios, torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64)).tolist()
    return dict(
        clean_forward_s=float(torch.tensor(clean_s, dtype=torch.float64).quantile(0.5)),
        ablated_forward_s=float(torch.tensor(ablated_s, dtype=torch.float64).quantile(0.5)),
        cost_ratio=med,
        cost_ratio_q1=q1,
        cost_ratio_q3=q3,
        cost_repeats=len(ratios),
        cost_stated=bool(q3 - q1 <= spread * med),
    )


def _clean_pass(model, w, mine, device, kw, want_means: bool):
    """(clean per-token losses (B, T) per batch, each forward's wall time, the gates' means or None) over this rank's
    batches: the gate means need all of them before any clamp at the mean."""
    clean, sums, counts, times = {}, {}, {}, []
    for n in mine:
        t0 = time.perf_counter()
        out = model.run_with_hooks(
            w.inputs(n, device), fwd_hooks=_gate_collector(sums, counts) if want_means else [], **kw
        )
        clean[n] = output_losses(model, out, w.targets(n, device)).double().cpu()  # (B, T)
        times.append(time.perf_counter() - t0)
    if not want_means:
        return clean, times, None
    sums, counts = all_sum(sums), all_sum(counts)
    return clean, times, {n: (sums[n] / counts[n]).float() for n in sums}  # per gate hook: (Hkv,), (H,) or (H, dv)


KEYS = ["intervention", "setting", "scope", "layer", "head", "site"]


def _with_linear_layers(results: pd.DataFrame, info) -> pd.DataFrame:
    """A hybrid model's results with a ``layer_type`` column (the ablated layer's type; "" for every layer at once or
    a depth site) and, beside each intervention's one-layer rows, one row per linear layer: marked "linear", its
    losses NaN (a linear layer has nothing these interventions edit). Other models' results are returned as they
    are."""
    if not linear_layers(info):
        return results
    kinds = [info.layer_types[l] if s in ("layer", "head") else "" for l, s in zip(results["layer"], results["scope"])]
    results = results.assign(layer_type=kinds)
    results = results[[*results.columns[:4], "layer_type", *results.columns[4:-1]]]  # beside the layer
    local = results[results["scope"] == "layer"]
    if local.empty:
        return results
    added = with_linear_layers(local, info, by=["intervention", "setting", "scope"])
    added = added[added["layer_type"] == "linear"].assign(head=-1, site="")
    out = pd.concat([results, added], ignore_index=True)
    group = out["intervention"] + "\0" + out["setting"]
    rank = pd.DataFrame({"g": group.map({g: i for i, g in enumerate(dict.fromkeys(group))}), "l": out["layer"]})
    rank["h"] = out["head"]
    return out.loc[rank.sort_values(["g", "l", "h"], kind="stable").index].reset_index(drop=True)


def _row(c: Ablation, batch: int, clean: torch.Tensor, ablated: torch.Tensor, late: torch.Tensor | None) -> dict:
    row = {
        "batch": batch,
        "intervention": c.intervention,
        "setting": c.setting,
        "scope": c.scope,
        "layer": -1 if c.layer is None else c.layer,
        "head": -1 if c.head is None else c.head,
        "site": c.site or "",
        "n_tokens": clean.numel(),
        "clean_sum": float(clean.sum()),
        "ablated_sum": float(ablated.sum()),
    }
    row["delta"] = (row["ablated_sum"] - row["clean_sum"]) / row["n_tokens"]
    if late is not None:
        n_late = int(late.sum()) * clean.shape[0]
        row.update(
            n_late=n_late, clean_late_sum=float(clean[:, late].sum()), ablated_late_sum=float(ablated[:, late].sum())
        )
        row["delta_late"] = (row["ablated_late_sum"] - row["clean_late_sum"]) / n_late if n_late else float("nan")
    return row


def _results(per_batch: pd.DataFrame) -> pd.DataFrame:
    """Pooled means over every batch (sums over tokens), delta's standard error over batches (with_batch_se)."""
    sums = [
        c
        for c in ("n_tokens", "clean_sum", "ablated_sum", "n_late", "clean_late_sum", "ablated_late_sum")
        if c in per_batch
    ]
    grouped = per_batch.groupby(KEYS, sort=False)
    g = grouped[sums].sum(min_count=1).join(grouped.size().rename("n_batches")).reset_index()
    res = g[KEYS].copy()
    res["loss_clean"] = g["clean_sum"] / g["n_tokens"]
    res["loss_ablated"] = g["ablated_sum"] / g["n_tokens"]
    res["delta"] = res["loss_ablated"] - res["loss_clean"]
    cols = ["delta"]
    if "n_late" in g:
        late = g["n_late"].where(g["n_late"] > 0)
        res["loss_clean_late"] = g["clean_late_sum"] / late
        res["loss_ablated_late"] = g["ablated_late_sum"] / late
        res["delta_late"] = res["loss_ablated_late"] - res["loss_clean_late"]
        cols.append("delta_late")
    res["n_batches"] = g["n_batches"]
    return with_batch_se(res, per_batch, cols, by=KEYS)


__all__ = [
    "ablate",
    "plan",
    "ablation_hooks",
    "find_mechanisms",
    "Ablation",
    "AblationError",
    "Mechanisms",
    "INTERVENTIONS",
    "VALUE_MODES",
    "GATE_MODES",
    "DEPTH_MODES",
    "SOURCE_CATEGORIES",
    "DEFAULT_KEEP",
    "DEFAULT_WINDOWS",
    "POSITIONS",
    "eviction_setting",
    "parse_eviction",
]
