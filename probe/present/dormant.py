"""Active and dormant heads (Guo et al. 2024): their figures."""

from __future__ import annotations

import plotly.express as px
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from probe.present.figures import integer_ticks
from probe.present.files import show

# One line on each file of this analysis an output folder may hold (probe.present.page's index.html shows them)
DESCRIPTIONS = {
    "sinks_dormant_summary.csv": "active / dormant heads: summary per input domain",
    "sinks_dormant_domains.csv": "active / dormant heads per input domain",
    "sinks_dormant_heads.csv": "key-0 mass per head and input domain",
    "sinks_dormant_switching.csv": "heads that switch between active and dormant across domains",
}


def dormant_figure(result: dict):
    """Left: share of dormant (head, input) pairs per layer, one bar series per domain; right: every (head, input) as
    key-0 mass against the output-norm ratio, coloured by domain, with both thresholds."""
    name = str(result["meta"]["model"].iloc[0])
    meta = result["meta"].iloc[0]
    fig = make_subplots(
        rows=1, cols=2, subplot_titles=("dormant share per layer", "key-0 mass vs output norm (each head x input)")
    )
    dom = result["domains"]
    inputs = result["inputs"]
    for i, (d, g) in enumerate(dom.groupby("domain", sort=False)):
        fig.add_trace(
            go.Bar(x=g["layer"], y=g["dormant_share"], name=d, legendgroup=d, marker_color=_colour(i)), row=1, col=1
        )
        s = inputs[inputs["domain"] == d]
        fig.add_trace(
            go.Scattergl(
                x=s["key0_mass"],
                y=s["z_ratio"],
                mode="markers",
                name=d,
                legendgroup=d,
                showlegend=False,
                marker=dict(size=4, opacity=0.5, color=_colour(i)),
                text=[f"L{l}H{h} window {b}.{r}" for l, h, b, r in zip(s["layer"], s["head"], s["batch"], s["row"])],
            ),
            row=1,
            col=2,
        )
    fig.add_vline(x=float(meta["threshold"]), line_dash="dot", line_color="gray", row=1, col=2)
    fig.add_hline(y=float(meta["norm_ratio"]), line_dash="dot", line_color="gray", row=1, col=2)
    fig.update_xaxes(title_text="layer", row=1, col=1)
    fig.update_yaxes(title_text="share of (head, input) dormant", range=[0, 1], row=1, col=1)
    fig.update_xaxes(title_text="mean attention on key 0", range=[0, 1], row=1, col=2)
    fig.update_yaxes(title_text="||z|| / head mean", row=1, col=2)
    fig.update_layout(title=f"Active and dormant heads — {name}", barmode="group")
    return fig


def dormant_heads_figure(result: dict):
    """Layer (x) x head (y) heatmap of the dormant rate, one panel per domain (one 0-1 scale: rates compared)."""
    sw = result["switching"]
    cols = [c for c in sw.columns if c.startswith("dormant_rate[")]
    fig = make_subplots(rows=1, cols=len(cols), subplot_titles=[c[len("dormant_rate[") : -1] for c in cols])
    for i, c in enumerate(cols, start=1):
        h = sw.pivot(index="head", columns="layer", values=c).sort_index()
        fig.add_trace(
            go.Heatmap(
                z=h.to_numpy(),
                x=list(h.columns),
                y=list(h.index),
                zmin=0,
                zmax=1,
                colorscale="Viridis",
                showscale=i == 1,
                colorbar=dict(title="dormant rate"),
            ),
            row=1,
            col=i,
        )
    integer_ticks(fig, "x", "layer")
    integer_ticks(fig, "y", "head")
    fig.update_layout(title=f"Dormant rate per head and domain — {result['meta']['model'].iloc[0]}")
    return fig


def _colour(i: int) -> str:
    pal = px.colors.qualitative.Plotly
    return pal[i % len(pal)]


def text_lines(result: dict) -> list[str]:
    return [
        "",
        "active / dormant heads (Guo et al.; dormant = key-0 mass > 0.5 on that input):",
        show(result["dormant_summary"]),
    ]
