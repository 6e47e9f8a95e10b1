"""What every analysis's figures share: one orientation, colour scales, integer layer ticks, log axes labelled with
whole numbers, labelled thresholds, standard-error bars (each analysis's own figures are in its module,
``probe.present.<analysis>``; each takes the dict of tables the analysis returned, or several to compare models, and
returns a ``plotly.graph_objects.Figure``), and the figures of the paired-seed recipes. ``write_html`` works offline."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from probe.analyses.stats import batch_se

ID_COLUMNS = ("model", "corpus")
# One orientation everywhere: layers (and read sites) run along the x axis, layer 0 at the left; heads, sources and
# models go on the y axis of heatmaps. Colour scales are colour-blind safe and fitted to the data's range.
SEQUENTIAL = "Viridis"
SIGNED = "RdBu"  # only for signed data, centred on 0
REFERENCE = dict(dash="dot", color="gray")


def many(results):
    """One result (a dict of tables) or several, as a list."""
    return [results] if isinstance(results, dict) else list(results)


def result_name(res) -> str:
    """The model a result is of."""
    return str(res["meta"]["model"].iloc[0])


def integer_ticks(fig: go.Figure, axis: str = "x", title: str = "layer", **where) -> go.Figure:
    """Whole-number ticks (layers, heads, read sites) on ``axis`` ("x" or "y") with its title."""
    update = fig.update_xaxes if axis == "x" else fig.update_yaxes
    update(title_text=title, tickmode="linear", tick0=0, dtick=1, tickformat="d", **where)
    return fig


def log_axis(fig: go.Figure, axis: str = "y", **where) -> go.Figure:
    """A log ``axis`` ("x" or "y") whose labels read as full numbers. Left to itself plotly labels a log axis that
    spans one to a few powers of ten at 1, 2, ..., 9 (or 1, 2, 5) times each power, writing all but the power as a
    bare digit in small type, so 20, 30, 40 read "2 3 4". Here every label is the whole number (``tickformat``), ticks
    are never put at every digit (those full labels would overlap near the top of each power of ten: 80 and 90 lie
    0.05 of a power apart): 1, 2 and 5 times each power over about one to three powers, each power over more, with the
    digits as unlabelled minor grid lines. ``where``: the subplot (row, col), as plotly's ``update_xaxes`` takes it."""
    values = np.concatenate(
        [
            np.asarray(getattr(t, axis), dtype=float).ravel()
            for t in fig.select_traces(**where)
            if getattr(t, axis, None) is not None
        ]
        or [np.array([])]
    )
    values = values[np.isfinite(values) & (values > 0)]
    span = float(np.log10(values.max() / values.min())) if len(values) else 0.0  # powers of ten the data cover
    ticks = dict(dtick="D2") if 0.8 <= span <= 3 else dict(dtick=1) if 3 < span <= 8 else {}
    minor = dict(minor=dict(dtick="D1", showgrid=True)) if ticks else {}
    update = fig.update_xaxes if axis == "x" else fig.update_yaxes
    update(type="log", tickformat="~g", **ticks, **minor, **where)
    return fig


LABEL_ROOM = 15  # px along an axis that one 11 px tick label needs to stay clear of the next (upright or at -60°)
PLOTLY_SIZE = dict(width=700, height=450, l=80, r=80, t=100, b=80)  # plotly's defaults where the layout sets none


def readable_category_ticks(fig: go.Figure, room: int = LABEL_ROOM) -> go.Figure:
    """Every category axis (tokens, heads, variants) labelled at every k-th category, k the smallest that leaves each
    label ``room`` px at the figure's size (its layout width and height less the margins, times the axis's share of
    the plot): a figure drawn smaller than it was laid out for (a page's column) shows fewer labels, not overlapping
    ones. Call it again after changing the size."""
    layout, margin = fig.layout, fig.layout.margin
    plot = {
        "x": (layout.width or PLOTLY_SIZE["width"]) - _margin(margin.l, "l") - _margin(margin.r, "r"),
        "y": (layout.height or PLOTLY_SIZE["height"]) - _margin(margin.t, "t") - _margin(margin.b, "b"),
    }
    for key in [k for k in layout.to_plotly_json() if k.startswith(("xaxis", "yaxis"))]:
        axis = layout[key]
        if axis.type != "category":
            continue
        ref = key[0] + key[5:]  # xaxis2 -> x2: how a trace names the axis it is drawn on
        if axis.range is not None:  # the categories shown at once (a window of a longer sequence)
            n = round(abs(axis.range[1] - axis.range[0]))
        else:
            n = len(axis.categoryarray) if axis.categoryarray is not None else _categories_on(fig, key[0], ref)
        share = (axis.domain[1] - axis.domain[0]) if axis.domain else 1.0
        step = max(1, math.ceil(n * room / max(plot[key[0]] * share, 1)))
        axis.update(dtick=step, tick0=0)
    return fig


def _margin(value, side: str) -> float:
    return PLOTLY_SIZE[side] if value is None else value


def _categories_on(fig: go.Figure, letter: str, ref: str) -> int:
    """The most categories a trace drawn on axis ``ref`` ("x", "y2", ...) spreads along it."""
    counts = [
        len(getattr(t, letter))
        for t in fig.data
        if (getattr(t, f"{letter}axis", None) or letter) == ref and getattr(t, letter, None) is not None
    ]
    return max(counts, default=0)


def threshold(fig: go.Figure, y: float, label: str, **where) -> go.Figure:
    """A labelled horizontal threshold line."""
    fig.add_hline(y=y, line=REFERENCE, annotation_text=label, annotation_position="top left", **where)
    return fig


def fitted_heatmap(z, x, y, title: str, **kw) -> go.Heatmap:
    """Heatmap whose colour scale spans the data's range (signed data: RdBu centred on 0, else Viridis)."""
    z = np.asarray(z, dtype=float)
    lo, hi = (float(np.nanmin(z)), float(np.nanmax(z))) if np.isfinite(z).any() else (0.0, 1.0)
    signed = lo < 0 < hi
    span = (
        dict(zmid=0, colorscale=SIGNED)
        if signed
        else dict(zmin=lo, zmax=hi if hi > lo else lo + 1e-12, colorscale=SEQUENTIAL)
    )
    return go.Heatmap(z=z, x=x, y=y, colorbar=dict(title=title), hoverongaps=False, **{**span, **kw})


def layer_se(batches: pd.DataFrame | None, key: str, by=("model", "layer")) -> pd.Series | None:
    """Standard error over evaluation batches of ``key`` per (model, layer); None without per-batch data."""
    if batches is None or batches.empty or key not in batches:
        return None
    se = batch_se(batches, [key], [c for c in by if c in batches], indexed=True)
    return None if se is None else se[f"{key}_se"]


def error_bars(se, keys) -> dict | None:
    if se is None:
        return None
    return dict(type="data", array=[float(se.get(k, np.nan)) for k in keys], visible=True)


def se_bars(table: pd.DataFrame, column: str) -> dict | None:
    """Error bars from ``table``'s ``<column>_se`` (standard errors the analysis computed), or None without that
    column (e.g. older saved results): the figure is still drawn, without bars."""
    if f"{column}_se" not in table:
        return None
    se = pd.to_numeric(table[f"{column}_se"], errors="coerce")  # None (a NaN saved as JSON) -> NaN
    return dict(type="data", array=se.astype(float).tolist(), visible=True)


def paired_figure(summary: pd.DataFrame) -> go.Figure:
    """Mean paired improvement ± standard error per variant (from stats.paired_differences(...)['summary'])."""
    fig = go.Figure(
        go.Bar(
            x=summary["variant"],
            y=summary["mean"],
            error_y=dict(type="data", array=summary["se"].fillna(0), visible=True),
            text=[f"{i}/{n} improved" for i, n in zip(summary["n_improved"], summary["n"])],
        )
    )
    fig.update_layout(
        title=f"Paired improvement over {summary['baseline'].iloc[0]} (± standard error over seeds)",
        xaxis_title="variant",
        yaxis_title="improvement (baseline - variant)",
    )
    return fig


def decomposition_figure(table: pd.DataFrame) -> go.Figure:
    """The abstention decomposition (stats.abstention_decomposition) as bars with standard errors."""
    t = table[table["quantity"] != "share"]
    fig = go.Figure(go.Bar(x=t["quantity"], y=t["mean"], error_y=dict(type="data", array=t["se"].fillna(0))))
    share = float(table.loc[table["quantity"] == "share", "mean"].iloc[0])
    fig.update_layout(
        title=f"Abstention decomposition (filter share {share:.0%})"
        if np.isfinite(share)
        else "Abstention decomposition",
        xaxis_title="component",
        yaxis_title="improvement over baseline (± s.e.)",
    )
    return fig


__all__ = [
    "ID_COLUMNS",
    "SEQUENTIAL",
    "SIGNED",
    "REFERENCE",
    "many",
    "result_name",
    "integer_ticks",
    "log_axis",
    "LABEL_ROOM",
    "readable_category_ticks",
    "threshold",
    "fitted_heatmap",
    "layer_se",
    "error_bars",
    "se_bars",
    "paired_figure",
    "decomposition_figure",
]
