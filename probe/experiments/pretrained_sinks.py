"""Sink statistics of pretrained models per layer type (Wang 2026 Table 14, App. "A production model
with a sink logit").

For every model in ``models`` (any name ``probe.load`` takes), on its own BOS-aware evaluation windows
(``probe.experiments.pretrained``): ``probe.analyses.sinks.sink_stats``, then per layer type (all layers, and where
the model has sliding-window or chunked layers: full, sliding / chunked, and those over the queries whose window or
chunk contains key 0)

    pos0_pct         attention mass on key 0 as a % of the mass on real keys (Table 14 "mass on position 0")
    phantom_pct      mass on the phantom as a % of all mass (0 for models without one)
    r0               ||v_0|| / median_j ||v_j||, mean of ratios over KV heads and sequences
    sink_logit_mean  the learned sink logit averaged over heads and the layers of that type (blank without one)
    uniform_ref_pct  the causal-uniform reference mean_t 1/(t+1) for the same rows

plus the same statistics per layer and a per-layer figure. Every model streams, a soft-capped one (Gemma 2) too: the
row masses apply its attention-logit cap.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from probe.analyses.sinks import sink_stats
from probe.experiments.pretrained import check_spec, each_model, window_meta
from probe.experiments.result import Result, Timer, config_dict
from probe.jobs.specs import EvaluationOptions

RECIPE = "pretrained-sinks"
TYPE_LAYERS = {
    "all": ("full", "sliding", "chunked"),
    "softmax": ("full", "sliding", "chunked"),  # a hybrid's softmax layers (its linear ones: the "linear" row)
    "linear": ("linear",),
    "full": ("full",),
    "sliding": ("sliding",),
    "sliding (key 0 in window)": ("sliding",),
    "chunked": ("chunked",),
    "chunked (key 0 in chunk)": ("chunked",),
}  # which layers' sink logits each by_type row averages


@dataclass
class PretrainedSinksConfig(EvaluationOptions):
    pass


CONFIG = PretrainedSinksConfig


def measure(model, windows, progress: bool = False) -> dict[str, pd.DataFrame]:
    """``sink_stats``: streaming row masses (with Gemma 2's attention-logit soft-cap where the model has one)."""
    return sink_stats(model, windows, progress=progress)


def pct(share: pd.Series) -> pd.Series:
    return 100 * share


def type_table(name: str, stats: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Table 14's rows of one model: one per row of ``by_type``."""
    by_type, layers = stats["by_type"], stats["layers"]
    rows = []
    for r in by_type.itertuples():
        kinds = layers[layers["layer_type"].isin(TYPE_LAYERS[r.layers])]
        rows.append(
            {
                "model": name,
                "layer_type": r.layers,
                "n_layers": r.n_layers,
                "pos0_pct": 100 * r.pos0_share,
                "phantom_pct": 100 * r.phantom_share,
                "r0": r.r0,
                "sink_logit_mean": kinds["sink_logit"].mean(),  # NaN (blank) without a sink logit
                "uniform_ref_pct": 100 * r.uniform_ref,
                "pos0_over_uniform": r.pos0_share / r.uniform_ref,
            }
        )
    return pd.DataFrame(rows)


def layer_table(name: str, stats: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """The same statistics per layer (key-0-window columns only for sliding and chunked layers)."""
    layers = stats["layers"]
    out = pd.DataFrame(
        {
            "model": name,
            "layer": layers["layer"],
            "layer_type": layers["layer_type"],
            "pos0_pct": pct(layers["pos0_share"]),
            "phantom_pct": pct(layers["phantom_share"]),
            "r0": layers["r0"],
            "sink_logit": layers["sink_logit"],
            "uniform_ref_pct": pct(layers["uniform_ref"]),
        }
    )
    for col, new in (
        ("pos0_share_key0", "pos0_key0_pct"),
        ("phantom_share_key0", "phantom_key0_pct"),
        ("uniform_ref_key0", "uniform_ref_key0_pct"),
    ):
        if col in layers:
            out[new] = pct(layers[col])
    return out


def head_table(name: str, stats: dict[str, pd.DataFrame]) -> pd.DataFrame:
    return (
        stats["heads"]
        .drop(columns=["model", "corpus"])
        .assign(model=name)
        .pipe(lambda df: df[["model"] + [c for c in df.columns if c != "model"]])
    )


def figure(layers: pd.DataFrame):
    """Per layer: position-0 %, phantom % and r0, one line per model (diamonds mark sliding layers); the dotted
    line in the first panel is each model's causal-uniform reference."""
    fig = make_subplots(
        rows=3,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.06,
        subplot_titles=("mass on position 0 (% of real keys)", "phantom mass (% of all)", "r0 = |v0| / median |vj|"),
    )
    palette = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"]
    for i, (model, g) in enumerate(layers.groupby("model", sort=False)):
        colour = palette[i % len(palette)]
        symbols = ["diamond" if t == "sliding" else "circle" for t in g["layer_type"]]
        for row, col in enumerate(("pos0_pct", "phantom_pct", "r0"), start=1):
            fig.add_trace(
                go.Scatter(
                    x=g["layer"],
                    y=g[col],
                    mode="lines+markers",
                    name=model,
                    legendgroup=model,
                    showlegend=row == 1,
                    line=dict(color=colour),
                    marker=dict(symbol=symbols, size=8),
                    text=g["layer_type"],
                    hovertemplate="layer %{x} (%{text}): %{y:.3g}",
                ),
                row=row,
                col=1,
            )
        fig.add_trace(
            go.Scatter(
                x=g["layer"],
                y=g["uniform_ref_pct"],
                mode="lines",
                legendgroup=model,
                showlegend=False,
                line=dict(color=colour, dash="dot"),
                name=f"{model} causal-uniform",
            ),
            row=1,
            col=1,
        )
    fig.add_hline(y=1, line=dict(color="grey", dash="dash"), row=3, col=1)
    fig.update_xaxes(title_text="layer", row=3, col=1)
    fig.update_layout(
        # the key on a line of its own: the whole sentence is wider than a figure in the site's column
        title="Sink statistics per layer<br><sup>diamonds: sliding-window layers; dotted: causal-uniform "
        "reference</sup>",
        height=800,
    )
    return fig


def run(cfg: PretrainedSinksConfig | None = None, *, progress: bool = False, out=None) -> Result:
    """Table 14 for every model of ``cfg.models``; with ``out``, finished models are stored there and reused."""
    cfg = cfg or PretrainedSinksConfig()
    names = check_spec(cfg)
    timer = Timer()

    def compute(name, model, windows):
        t0 = time.perf_counter()
        stats = measure(model, windows, progress)
        tables = {
            "table14": type_table(name, stats),
            "layers": layer_table(name, stats),
            "heads": head_table(name, stats),
            "summary": stats["summary"].drop(columns=["model", "corpus"]).assign(model=name),
        }
        meta = {
            **window_meta(windows, model),
            "method": stats["meta"]["method"].iloc[0],
            "seconds": round(time.perf_counter() - t0, 2),
        }
        return tables, meta

    done = each_model(RECIPE, names, cfg, out, compute, progress)
    tables = {
        k: pd.concat([t[k] for _, t, _ in done], ignore_index=True) for k in ("table14", "layers", "heads", "summary")
    }
    tables["models"] = pd.DataFrame([{"model": name, **meta} for name, _, meta in done])
    return Result(
        RECIPE,
        config_dict(cfg),
        tables,
        {"layers": figure(tables["layers"])},
        timer.meta(models=len(names)),
        headline=("table14", "layers", "summary", "models"),
    )


__all__ = ["PretrainedSinksConfig", "measure", "type_table", "layer_table", "figure", "run"]
