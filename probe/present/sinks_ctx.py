"""`probe sinks --ctx T1 T2 ...`: attention sinks against context length (probe.analyses.context_sweep): its terminal
text, figure, page sections and the descriptions of its files."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from probe.present.figures import log_axis
from probe.present.files import header, result_meta, show
from probe.present.sections import drop_ids, linear_note
from probe.present.terminal import note_lines

# One line on each file of this analysis an output folder may hold (probe.present.page's index.html shows them)
DESCRIPTIONS = {
    "sinks_ctx.html": "attention sinks against context length: figure against log T per layer type, tables",
    "sinks_ctx.json": "attention sinks against context length: every table and the run's settings (JSON)",
    "sinks_ctx_summary.csv": "per context length T: position-0 share, causal-uniform reference, r0, Sink^eps share, "
    "largest massive activation",
    "sinks_ctx_by_type.csv": "per context length and layer type (sliding / full): means over the layers of that type",
    "sinks_ctx_layers.csv": "per context length and layer: sink statistics, Sink^eps share, massive activations",
    "sinks_ctx_meta.csv": "the sweep's settings: model, corpus, contexts, eps",
}

TITLE = "Attention sinks against context length"
TYPE_COLOURS = {"full": "#1f77b4", "sliding": "#ff7f0e"}
PANELS = (
    ("pos0_share", "position-0 share (dashed: causal-uniform)"),
    ("r0", "r0 (value norm at key 0 / mean)"),
    ("sink_share", "Sink^ε share of heads"),
    ("massive_top1", "largest |activation| entering the layer"),
)


def sweep_figure(result: dict) -> go.Figure:
    """Each statistic against T (log axis): one thin line per layer and a thick one per layer type (mean over its
    layers), coloured by type; the position-0 panel has each type's causal-uniform reference dashed beside it."""
    layers, by_type = result["layers"], result["by_type"]
    panels = [(col, title) for col, title in PANELS if col in layers and layers[col].notna().any()]
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[t for _, t in panels])
    for c, (col, _) in enumerate(panels, start=1):
        for layer, g in layers.groupby("layer"):
            kind = g["layer_type"].iloc[0]
            fig.add_trace(
                go.Scatter(
                    x=g["ctx"],
                    y=g[col],
                    mode="lines",
                    line=dict(width=1, color=TYPE_COLOURS.get(kind, "#888")),
                    opacity=0.35,
                    showlegend=False,
                    name=f"layer {layer} ({kind})",
                    hovertemplate=f"layer {layer} ({kind})" + ", T %{x}: %{y:.4g}<extra></extra>",
                ),
                row=1,
                col=c,
            )
        for kind, g in by_type.groupby("layer_type", sort=False):
            colour = TYPE_COLOURS.get(kind, "#888")
            fig.add_trace(
                go.Scatter(
                    x=g["ctx"],
                    y=g[col],
                    mode="lines+markers",
                    line=dict(width=3, color=colour),
                    name=f"{kind} layers (mean)",
                    legendgroup=kind,
                    showlegend=c == 1,
                ),
                row=1,
                col=c,
            )
            if col == "pos0_share":
                fig.add_trace(
                    go.Scatter(
                        x=g["ctx"],
                        y=g["uniform_ref"],
                        mode="lines",
                        name=f"{kind}: causal-uniform",
                        line=dict(dash="dash", color=colour),
                        legendgroup=kind,
                    ),
                    row=1,
                    col=c,
                )
        ticks = sorted(layers["ctx"].unique())
        fig.update_xaxes(
            type="log",
            title_text="context length T (log)",
            tickvals=ticks,
            ticktext=[str(int(t)) for t in ticks],
            row=1,
            col=c,
        )
    if "pos0_share" in dict(panels):
        log_axis(fig, "y", row=1, col=1)
    fig.update_layout(
        title="Attention sinks against context length, per layer type", height=420, legend=dict(orientation="h", y=-0.3)
    )
    return fig


def figures(result: dict) -> list:
    return [sweep_figure(result)]


def _verdicts(result: dict) -> list[str]:
    s = result["summary"]
    first, last = s.iloc[0], s.iloc[-1]
    lines = [
        f"T = {int(first['ctx'])} → {int(last['ctx'])}: position 0 takes {first['pos0_share']:.2%} → "
        f"{last['pos0_share']:.2%} of each row's real attention ({first['pos0_over_uniform']:.3g}x → "
        f"{last['pos0_over_uniform']:.3g}x the causal-uniform reference), "
        f"r0 {first['r0']:.3g} → {last['r0']:.3g}, "
        f"Sink^{first['epsilon']:g} {first['sink_share']:.1%} → {last['sink_share']:.1%} of heads"
    ]
    if "max_magnitude" in s:
        lines.append(f"largest activation {first['max_magnitude']:.4g} → {last['max_magnitude']:.4g}")
    slope = _log_slope(s["ctx"], s["pos0_share"])
    if slope is not None:
        lines.append(f"position-0 share changes by {slope:+.3g} per doubling of T (least squares on log2 T)")
    return lines


def _log_slope(ctx, y) -> float | None:
    x = np.log2(np.asarray(ctx, dtype=float))
    y = np.asarray(y, dtype=float)
    ok = np.isfinite(y)
    if ok.sum() < 2:
        return None
    return float(np.polyfit(x[ok], y[ok], 1)[0])


def sections(result: dict) -> dict:
    tables = [
        ("Per context length (rows t >= 1, averaged over heads and layers)", drop_ids(result["summary"])),
        ("Per context length and layer type (means over the layers of the type)", drop_ids(result["by_type"])),
        ("Per context length and layer", drop_ids(result["layers"])),
    ]
    note = linear_note(result_meta(result))
    return {"verdicts": _verdicts(result), "caveats": [note] if note else [], "tables": tables}


def text(result: dict) -> str:
    meta = result_meta(result)
    note = linear_note(meta)
    lines = [
        header({k: v for k, v in meta.items() if k != "ctx"}),
        f"contexts: {meta.get('ctx')}",
        *note_lines(note),
        "",
        *_verdicts(result),
        "",
        "per context length:",
        show(result["summary"]),
        "",
        "per layer type:",
        show(
            result["by_type"],
            ["ctx", "layer_type", "layers", "pos0_share", "uniform_ref", "r0", "sink_share", "massive_top1"],
        ),
    ]
    return "\n".join(lines)


__all__ = ["sweep_figure", "figures", "sections", "text", "TITLE", "DESCRIPTIONS"]
