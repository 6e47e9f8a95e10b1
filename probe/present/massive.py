"""Massive activations (Sun et al. 2024): their figure."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from probe.present.figures import log_axis
from probe.present.files import show

# One line on each file of this analysis an output folder may hold (probe.present.page's index.html shows them)
DESCRIPTIONS = {
    "sinks_massive_summary.csv": "massive activations: summary",
    "sinks_massive_layers.csv": "massive activations per layer",
    "sinks_massive_top.csv": "massive activations: the largest hidden-state entries",
    "sinks_massive_dims.csv": "massive activations per hidden dimension",
}


def massive_figure(result: dict):
    """Left: top-1/2/3 and median magnitude per layer (log scale) with the absolute threshold; right: where the top
    activation sits (share at position 0), the key-0 attention mass and r0 per layer."""
    lay = result["layers"]
    name = str(result["meta"]["model"].iloc[0])
    fig = make_subplots(
        rows=1, cols=2, subplot_titles=("residual-stream magnitudes (log scale)", "alignment with the sink")
    )
    for col, dash in (("top1", None), ("top2", "dash"), ("top3", "dot"), ("median", None)):
        fig.add_trace(
            go.Scatter(
                x=lay["layer"],
                y=lay[col],
                mode="lines+markers",
                name=col,
                line=dict(dash=dash, color="gray" if col == "median" else None),
                text=[f"{h}<br>top-1 dim {d}" for h, d in zip(lay["hook"], lay["top1_dim"])],
            ),
            row=1,
            col=1,
        )
    thr = float(result["summary"]["abs_threshold"].iloc[0])  # a trace, not a shape: shapes on log axes take log10(y)
    fig.add_trace(
        go.Scatter(
            x=[lay["layer"].min(), lay["layer"].max()],
            y=[thr, thr],
            mode="lines",
            line=dict(dash="dot", color="red"),
            name=f"|h| = {thr:g} (massive threshold)",
        ),
        row=1,
        col=1,
    )
    for col in ("top1_pos0_share", "key0_mass", "r0", "r_top"):
        fig.add_trace(go.Scatter(x=lay["layer"], y=lay[col], mode="lines+markers", name=col), row=1, col=2)
    log_axis(fig, "y", row=1, col=1).update_yaxes(title_text="|h|", row=1, col=1)
    fig.update_xaxes(title_text="layer (input stream of; L = last output)")
    fig.update_layout(title=f"Massive activations — {name}")
    return fig


PART = ("summary", "layers", "top", "dims")  # a sinks result holds them as massive_<table>


def part(result: dict) -> dict:
    """The massive-activation tables of a `probe sinks --massive` result, as ``massive_activations`` returns them."""
    return {"meta": result["meta"], **{k: result[f"massive_{k}"] for k in PART}}


def text_lines(result: dict) -> list[str]:
    return [
        "",
        "massive activations (Sun et al.; |h| > 100 and > 1000 x median):",
        show(
            result["massive_layers"],
            ["layer", "layer_type", "top1", "median", "ratio", "top1_dim", "n_massive", "key0_mass", "r0"],
        ),
    ]
