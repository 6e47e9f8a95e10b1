"""Sink^eps (Gu et al. 2025): its figures."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from probe.analyses.sink_heads import BRANCH_EPS_COLUMNS
from probe.present.figures import fitted_heatmap, integer_ticks, many, se_bars
from probe.present.files import show

# One line on each file of this analysis an output folder may hold (probe.present.page's index.html shows them)
DESCRIPTIONS = {
    "sinks_sink_eps_summary.csv": "Sink^eps: share of heads whose mean attention on key 0 exceeds eps",
    "sinks_sink_eps_layers.csv": "Sink^eps per layer",
    "sinks_sink_eps_heads.csv": "Sink^eps: mean attention on key 0 per layer and head",
}


def sink_eps_figure(results):
    """Left: share of sink heads per layer (one line per model and ε, ± jackknife s.e. over batches where the result
    has it); right: key-0 score per head (layer x head) of the first result."""
    res0 = many(results)[0]
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=(
            "share of sink heads per layer (Sink^ε)",
            f"key-0 score per head — {res0['meta']['model'].iloc[0]}",
        ),
    )
    for res in many(results):
        name = str(res["meta"]["model"].iloc[0])
        for e, g in res["layers"].groupby("epsilon", sort=False):
            fig.add_trace(
                go.Scatter(
                    x=g["layer"],
                    y=g["sink_share"],
                    mode="lines+markers",
                    name=f"{name} ε={e:g}",
                    error_y=se_bars(g, "sink_share"),
                    hovertemplate="layer %{x}: %{y:.2f}<extra>" + f"{name} ε={e:g}</extra>",
                ),
                row=1,
                col=1,
            )
    heads = res0["heads"].pivot(index="head", columns="layer", values="key0_mass")
    fig.add_trace(
        fitted_heatmap(heads.to_numpy(), list(heads.columns), list(heads.index), "mean a[t,0]", showlegend=False),
        row=1,
        col=2,
    )
    fig.update_yaxes(title_text="share of heads with α > ε", range=[-0.02, 1.02], row=1, col=1)
    integer_ticks(fig, "x", "layer")
    integer_ticks(fig, "y", "head", row=1, col=2)
    fig.update_layout(
        title="Sink heads (Gu et al.): mean attention on key 0 above ε", legend=dict(orientation="h", y=-0.25)
    )
    return fig


def sink_eps_trend_figure(summary: pd.DataFrame):
    """Sink^ε across models or training checkpoints: ``summary`` is the concatenation of several results' ``summary``
    tables with a ``model`` column (and ``step`` where the models are checkpoints of one run, as ``probe report``
    writes them). x = training step when every row has one, else the model; ± jackknife s.e. over batches where the
    summary has ``sink_share_se``."""
    steps = summary["step"] if "step" in summary else pd.Series([None] * len(summary), index=summary.index)
    by_step = steps.notna().all()
    fig = go.Figure()
    for e, g in summary.groupby("epsilon", sort=False):
        x = g["step"].astype(int) if by_step else g["model"]
        fig.add_trace(
            go.Scatter(
                x=x,
                y=g["sink_share"],
                mode="lines+markers" if by_step else "markers",
                name=f"ε = {e:g}",
                text=g["model"],  # markers only between unrelated models
                error_y=se_bars(g, "sink_share"),
            )
        )
    fig.update_layout(
        title="Sink^ε: share of heads whose mean attention on key 0 exceeds ε",
        xaxis_title="training step" if by_step else "model",
        yaxis_title="Sink^ε",
        yaxis_range=[-0.02, 1.02],
    )
    return fig


def sink_eps_layers_figure(layers: pd.DataFrame, epsilon: float | None = None):
    """Share of sink heads per layer across models or checkpoints (heatmap: layers on x like every per-layer figure,
    one row per model or training step) at one ε (default: the smallest): ``layers`` is the concatenation of several
    results' ``layers`` tables with a ``model`` column (and ``step``), as ``probe report`` collects them."""
    e = float(layers["epsilon"].min()) if epsilon is None else float(epsilon)
    sub = layers[layers["epsilon"] == e]
    if sub.empty:
        raise ValueError(f"epsilon={e:g} is not among the table's thresholds {sorted(layers['epsilon'].unique())}")
    models = list(dict.fromkeys(sub["model"]))
    steps = sub.drop_duplicates("model").set_index("model")["step"] if "step" in sub else None
    by_step = steps is not None and steps.notna().all()
    wide = sub.pivot_table(index="model", columns="layer", values="sink_share", sort=False).loc[models]
    y = [str(int(steps[m])) for m in models] if by_step else models
    fig = go.Figure(
        go.Heatmap(
            z=wide.to_numpy(),
            x=list(wide.columns),
            y=y,
            zmin=0,
            zmax=1,
            colorscale="Viridis",
            colorbar=dict(title="sink share"),
        )
    )
    fig.update_yaxes(type="category", title_text="training step" if by_step else "model")
    integer_ticks(fig, "x", "layer")
    fig.update_layout(title=f"Share of sink heads per layer (Sink^ε, ε = {e:g})")
    return fig


PART = ("summary", "layers", "heads")  # a sinks result holds them as sink_eps_<table>


def part(result: dict) -> dict:
    """The Sink^eps tables of a `probe sinks` result, as ``sink_heads`` returns them."""
    return {"meta": result["meta"], **{k: result[f"sink_eps_{k}"] for k in PART}}


def text_lines(result: dict) -> list[str]:
    """`probe sinks`'s terminal lines on sink heads."""
    summary = result["sink_eps_summary"]
    meta = result["meta"]
    per_text = "protocol" in meta and meta["protocol"].iloc[0] == "gu2025"
    how = " (protocol gu2025: per text, queries 0..63, mean of the indicators over texts)" if per_text else ""
    return [
        "",
        f"sink heads (Gu et al.): share of heads whose mean attention on key 0 ({summary['key0'].iloc[0]}) "
        f"exceeds eps{how}:",
        show(
            summary,
            [
                "epsilon",
                "n_sink_heads",
                "n_heads",
                "sink_share",
                "sink_share_se",
                "key0_mass",
                "key0_mass_se",
                "phantom_share",
                "uniform_ref",
                *BRANCH_EPS_COLUMNS,
            ],
        ),
    ]
