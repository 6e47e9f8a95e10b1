"""Attention sinks against context length: `probe sinks --ctx 1024 4096 16384 32768`
(docs/definitions.md#context-sweep).

One :func:`probe.analyses.sink_pass.sink_analyses` per context length T (sink statistics, Sink^ε and, with
``massive``, massive activations from one forward per batch), on windows of T tokens; the per-context results are
joined into tables indexed by T: per layer (``layers``), per layer type (``by_type``: sliding / full, means over the
layers of that type) and per T (``summary``), each with the causal-uniform reference of that T beside the position-0
share (docs/definitions.md#causal-uniform-reference). Memory per T is the streaming analyses' (linear in T on HF
checkpoints, docs/definitions.md#long-context).
"""

from __future__ import annotations

import pandas as pd

from probe.analyses.capture import as_windows, describe, finish
from probe.analyses.layer_types import layer_meta
from probe.analyses.sink_heads import DEFAULT_EPS
from probe.analyses.sink_pass import sink_analyses
from probe.analyses.sinks import BRANCH_COLUMNS

# per-layer columns taken from each context's sink statistics, Sink^ε (first ε) and massive-activation tables, where
# the model has them (differential attention: each branch's, _1 and _2, beside the net row's)
BRANCHES = ("_1", "_2")
SINK_COLUMNS = (
    "pos0_share",
    "uniform_ref",
    "phantom_share",
    "row_mass",  # a rule's rows: their mass (sigmoid's grows with T)
    "r0",
    "pos0_share_key0",
    "uniform_ref_key0",
    *BRANCH_COLUMNS,
)
# the summary's columns taken from each context's sink statistics, where the model has them
SUMMARY_COLUMNS = (
    "pos0_share",
    "uniform_ref",
    "pos0_over_uniform",
    "phantom_share",
    "row_mass",
    "r0",
    "sink_formed",
    *BRANCH_COLUMNS,
)
SINK_EPS_COLUMNS = ("sink_share", "key0_mass", *(f"{c}{b}" for c in ("sink_share", "key0_mass") for b in BRANCHES))
MASSIVE_COLUMNS = {"top1": "massive_top1", "ratio": "massive_ratio", "n_massive": "n_massive"}
SWEPT = ("pos0_share", "uniform_ref", "r0", "sink_share", "massive_top1", "massive_ratio")


def context_layers(ctx: int, found: dict) -> pd.DataFrame:
    """One context's per-layer row: sink statistics, the first ε's Sink^ε share and, when computed, the largest
    residual-stream activation entering the layer (``hook_resid_pre``) and its ratio to the median."""
    layers = found["sinks"]["layers"]
    rows = layers[["layer", "layer_type", *[c for c in SINK_COLUMNS if c in layers]]].copy()
    eps = found["sink_eps"]["layers"]
    eps = eps[eps["epsilon"] == eps["epsilon"].iloc[0]].set_index("layer")
    for col in (c for c in SINK_EPS_COLUMNS if c in eps):
        rows[col] = rows["layer"].map(eps[col])
    if "massive" in found:
        mas = found["massive"]["layers"]
        mas = mas[mas["hook"].str.endswith("hook_resid_pre")].set_index("layer")
        for src, dst in MASSIVE_COLUMNS.items():
            rows[dst] = rows["layer"].map(mas[src])
    rows.insert(0, "ctx", ctx)
    return rows


def sweep_tables(per_ctx: dict[int, dict]) -> dict[str, pd.DataFrame]:
    """``layers`` (ctx x layer), ``by_type`` (ctx x layer type, means over layers) and ``summary`` (one row per ctx:
    the sink statistics' summary over layers past the first, the Sink^ε share and the largest massive activation)."""
    layers = pd.concat([context_layers(ctx, found) for ctx, found in per_ctx.items()], ignore_index=True)
    numeric = [c for c in layers.columns if c not in ("ctx", "layer", "layer_type")]
    groups = layers.groupby(["ctx", "layer_type"], sort=False)
    by_type = groups[numeric].mean().reset_index()
    by_type.insert(2, "layers", groups.size().to_numpy())
    summary = []
    for ctx, found in per_ctx.items():
        s = found["sinks"]["summary"].iloc[0]
        row = {
            "ctx": ctx,
            **{k: s[k] for k in SUMMARY_COLUMNS if k in s},
        }
        e = found["sink_eps"]["summary"].iloc[0]
        row.update(
            epsilon=e["epsilon"], **{k: e[k] for k in ("sink_share", *(f"sink_share{b}" for b in BRANCHES)) if k in e}
        )
        if "massive" in found:
            m = found["massive"]["summary"].iloc[0]
            row.update(max_magnitude=m["max_magnitude"], max_layer=m["max_layer"], max_ratio=m["max_ratio"])
        summary.append(row)
    return {"summary": pd.DataFrame(summary), "by_type": by_type, "layers": layers}


def sink_context_sweep(
    model,
    windows_by_ctx: dict,
    *,
    eps=DEFAULT_EPS,
    massive: bool = False,
    tokenizer=None,
    backend: str | None = None,
    progress: bool = False,
    protocol: str = "pooled",
):
    """``(sweep, per_ctx)``: the sweep's tables (``summary``, ``by_type``, ``layers``, ``meta``) over the contexts of
    ``windows_by_ctx`` ({T: windows of T tokens}, in the order given), and each context's whole
    :func:`sink_analyses` result.

    Tables (columns):

    - ``summary``: model, corpus, ctx, pos0_share, uniform_ref, pos0_over_uniform, phantom_share, r0, sink_formed,
      epsilon, sink_share
    - ``by_type``: model, corpus, ctx, layer_type, layers, pos0_share, uniform_ref, phantom_share, r0, sink_share,
      key0_mass
    - ``layers``: model, corpus, ctx, layer, layer_type, pos0_share, uniform_ref, phantom_share, r0, sink_share,
      key0_mass

    A model whose rows are not softmax's adds ``row_mass`` (summary, by_type, layers). A differential-attention
    model adds each branch's ``pos0_share_1`` / ``_2`` (summary, by_type, layers) and
    ``sink_share_1`` / ``_2`` (all three) and ``key0_mass_1`` / ``_2`` (by_type, layers), as its single-context
    tables do; the unsuffixed columns are the net row's (docs/definitions.md#differential-attention).
    """
    per_ctx = {}
    for ctx, data in windows_by_ctx.items():
        kw = dict(eps=eps, massive=massive, tokenizer=tokenizer, backend=backend, progress=progress)
        if protocol != "pooled":
            kw["protocol"] = protocol
        per_ctx[int(ctx)] = sink_analyses(model, data, **kw)
    first = as_windows(next(iter(windows_by_ctx.values())))
    # each row names the windows it was measured on (a synthetic corpus's label carries T); the meta, every context's
    corpora = {ctx: found["sinks"]["summary"]["corpus"].iloc[0] for ctx, found in per_ctx.items()}
    eps_list = [eps] if isinstance(eps, (int, float)) else list(eps)
    meta = describe(
        model,
        first,
        "sink_context_sweep",
        ctx=" ".join(str(c) for c in per_ctx),
        corpus=" | ".join(dict.fromkeys(corpora.values())),
        eps=eps_list[0],
        massive=massive,
        **layer_meta(model.probe_info),  # a hybrid's linear layers: listed with NaN, summaries over softmax layers
    )
    sweep = finish(sweep_tables(per_ctx), meta)
    for name, table in sweep.items():
        if name != "meta":
            table["corpus"] = table["ctx"].map(corpora)
    return sweep, per_ctx


__all__ = ["sink_context_sweep", "sweep_tables", "context_layers", "SWEPT"]
