"""The sink-mechanism companions on `probe report`'s page and terminal text: attention entropy (Zhai et al.), outlier
kurtosis (He et al.), key 0's norm-weighted share (Kobayashi et al.) and the last token's sensitivity (Barbero et
al.) per model or checkpoint, beside the position-0 share, so a run's snapshots show them as the sink forms."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

# report table -> (summary columns shown, the statistic drawn across models or steps, its title, its axis)
MECHANISM_VIEWS = {
    "entropy": (
        ["entropy", "entropy_se", "entropy_norm", "entropy_norm_se", "min_layer", "min_layer_entropy_norm"],
        "entropy_norm",
        "Attention entropy / log(outcomes seen), mean over heads and layers (Zhai et al.; low: collapsed heads)",
        "normalised entropy (0 one key, 1 uniform)",
    ),
    "kurtosis": (
        ["kurtosis", "max_kurtosis", "max_layer", "last_kurtosis"],
        "kurtosis",
        "Outlier kurtosis of neuron RMS, mean over layers (He et al.; 1: neurons of equal RMS, large: outliers)",
        "kurtosis (unitless)",
    ),
    "norm_weighted": (
        ["share", "share_se", "norm_share", "norm_share_se", "top_layer", "top_head", "top_norm_share"],
        "norm_share",
        "Key 0's share of the norm-weighted attention ||a f(x)||, mean over heads and layers (Kobayashi et al.)",
        "share of ||a f(x)||",
    ),
    "sensitivity": (
        ["layer", "first_share", "mixing", "last_share", "decay_slope", "first", "rest_mean", "last"],
        "mixing",
        "Over-mixing: the share of the last token's sensitivity on positions 1..T-2, at the last layer (Barbero et "
        "al.; a sink keeps it low)",
        "share of sum_i ||dy/de_i||",
    ),
}
TITLES = {
    "entropy": "Attention entropy per model (Zhai et al.; *_se: s.e. over batches; entropy_norm: / log outcomes seen)",
    "kurtosis": "Outlier kurtosis per model (He et al.; of each layer's neuron RMS, mean over layers)",
    "norm_weighted": "Key 0's share by weight and by norm ||a f(x)|| per model (Kobayashi et al.; *_se: s.e. over "
    "batches)",
    "sensitivity": "The last token's sensitivity ||dy/de_i|| at the last layer per model, on the first batch of "
    "windows (Barbero et al.; first_share: position 0's share, mixing: positions 1..T-2's)",
}


def mechanism_sections(tables: dict) -> list[tuple[str, pd.DataFrame]]:
    """The page's table of each companion the report has: its summary columns per model."""
    shown = []
    for name, (cols, *_) in MECHANISM_VIEWS.items():
        if name in tables:
            df = tables[name]
            shown.append((TITLES[name], df[[c for c in ["model", "step", "ctx", *cols] if c in df]]))
    return shown


def mechanism_figures(tables: dict, xs: dict, by_step: bool, xtitle: str, across) -> list[go.Figure]:
    """One figure per companion: its statistic across models (dots) or training steps (a line), ± the analysis's
    standard error where it has one; ``across`` draws a series as the report's other figures do."""
    figs = []
    for name, (_, col, title, unit) in MECHANISM_VIEWS.items():
        if name not in tables:
            continue
        rows = tables[name]
        se = dict(zip(rows["model"], rows[f"{col}_se"])) if f"{col}_se" in rows else None
        fig = go.Figure(across(xs, by_step, rows, col, col, se))
        fig.update_layout(title=title, xaxis_title=xtitle, yaxis_title=unit, yaxis_rangemode="tozero")
        if not by_step:
            fig.update_xaxes(type="category")
        figs.append(fig)
    return figs


def mechanism_columns(tables: dict) -> pd.DataFrame | None:
    """One row per model (or per model and T): the position-0 share beside each companion's drawn statistic, for the
    terminal; None when the report has none of them."""
    names = [n for n in MECHANISM_VIEWS if n in tables]
    if not names:
        return None
    keys = [c for c in ("model", "step", "ctx") if c in tables["summary"]]
    out = tables["summary"][[*keys, "pos0_share", "pos0_over_uniform"]]
    for name in names:
        col = MECHANISM_VIEWS[name][1]
        out = out.merge(tables[name][[*keys, col]], on=keys, how="left")
    return out


__all__ = ["mechanism_sections", "mechanism_figures", "mechanism_columns", "MECHANISM_VIEWS"]
