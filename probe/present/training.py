"""`probe train`: its training curves, the run's page and the descriptions of its files."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from probe.runs import TRAINING_PAGE

TRAINING_PANELS = (("lr", "learning rate", "learning rate"), ("grad_norm", "gradient norm", "norm before clipping"))


def training_figure(runs) -> go.Figure:
    """Training curves against step: training and validation loss on one axis (top), learning rate and gradient norm
    (below), one colour per run; validation dashed with markers.

    ``runs``: a ``read_metrics`` DataFrame, or a dict {label: DataFrame} to compare runs (paired variants, say)."""
    runs = {"run": runs} if isinstance(runs, pd.DataFrame) else dict(runs)
    fig = make_subplots(
        rows=2,
        cols=2,
        specs=[[{"colspan": 2}, None], [{}, {}]],
        vertical_spacing=0.14,
        subplot_titles=["training loss (solid) and validation loss (dashed)"]
        + [title for _, title, _ in TRAINING_PANELS],
    )
    colours = fig.layout.template.layout.colorway or [None]
    for i, (label, df) in enumerate(runs.items()):
        colour = colours[i % len(colours)]
        for col, kind, dash in (("loss", "training", "solid"), ("val_loss", "validation", "dash")):
            if col in df:
                d = df[["step", col]].dropna()
                fig.add_trace(
                    go.Scatter(
                        x=d["step"],
                        y=d[col],
                        name=f"{label} {kind}",
                        legendgroup=str(label),
                        mode="lines+markers" if col == "val_loss" else "lines",
                        line=dict(color=colour, dash=dash),
                    ),
                    row=1,
                    col=1,
                )
        for j, (col, _, _) in enumerate(TRAINING_PANELS):
            if col in df:
                d = df[["step", col]].dropna()
                fig.add_trace(
                    go.Scatter(
                        x=d["step"],
                        y=d[col],
                        name=str(label),
                        legendgroup=str(label),
                        showlegend=False,
                        mode="lines",
                        line=dict(color=colour),
                    ),
                    row=2,
                    col=j + 1,
                )
    fig.update_xaxes(title_text="step")
    fig.update_yaxes(title_text="loss (nats per token)", row=1, col=1)
    for j, (_, _, axis) in enumerate(TRAINING_PANELS):
        fig.update_yaxes(title_text=axis, row=2, col=j + 1)
    fig.update_layout(title="Training", height=700)
    return fig


DESCRIPTIONS = {
    "metrics.jsonl": "training metrics, one JSON line per logged step",
    TRAINING_PAGE: "training curves",
}


def write_training_page(
    out: Path, model_name: str, ident: dict, metrics: pd.DataFrame, self_contained: bool = False
) -> None:
    """The run's settings and curves (loss, validation loss, lr, gradient norm), atomically, beside the folder's
    shared plotly.min.js and index.html (``self_contained``: plotly.js inline instead)."""
    from probe.present.files import write_pages
    from probe.present.page import page

    html = page(
        f"probe train: {model_name} ({out.name})",
        [training_figure(metrics)],
        intro=ident,
        self_contained=self_contained,
    )
    write_pages(out, {TRAINING_PAGE: html})


def training_text(result: dict, out: Path) -> str:
    """`probe train`'s terminal text: the last logged metrics, where the model and the curves are."""
    keys = [k for k in ("step", "loss", "val_loss", "lr", "grad_norm", "tokens", "tokens_per_s") if k in result]
    lines = [f"{k:<14}{result[k]:.4g}" if isinstance(result[k], float) else f"{k:<14}{result[k]}" for k in keys]
    lines.append(f"model saved to {result['model_dir']} (probe eval --model {out}); curves in {out / TRAINING_PAGE}")
    return "\n".join(lines)
