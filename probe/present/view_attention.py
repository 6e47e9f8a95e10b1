"""Figures of one text's attention: one layer's heads (``attention_view``, long texts in windows of queries) and every
layer and head with a picker (``attention_picker_view``, what ``probe view`` shows).

Long sequences stay light in a browser: up to ``max_full`` tokens ``attention_view`` draws the whole T x T pattern per
head; beyond, a slider steps through windows of ``window`` queries, each shown against its own keys plus three summary
columns (the phantom, key 0 and the summed mass on keys 1..s-1 that fall before the window), so every row's mass is
still accounted for; only one window's cells are drawn at a time and the stored data grow as T x window, not T².
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from probe.present.figures import SEQUENTIAL, SIGNED, readable_category_ticks
from probe.present.view_tokens import TOKEN_TICKS, WINDOW, labels_of, spans

MAX_FULL = 128


def _axis(kind: str, k: int) -> str:
    return kind + ("" if k == 1 else str(k))


def _window_axes(labels, lead, s: int, e: int, full: bool) -> tuple[list, list]:
    """(key columns, query rows) of the window of queries s..e-1: before its own keys, the phantom, key 0 and the summed
    keys 1..s-1 (the whole pattern when ``full``)."""
    if full:
        return lead + labels, labels
    before = ([labels[0]] if s > 0 else []) + ([f"keys 1–{s - 1} (sum)"] if s > 1 else [])
    return lead + before + labels[s:e], labels[s:e]


def _window_cells(p, phantom, s: int, e: int, full: bool):
    """One head's cells for the columns of ``_window_axes``; p: (T, T) with NaN above the diagonal, phantom: (T,)."""
    if full:
        blocks = [p]
    else:
        blocks = (
            ([p[s:e, :1]] if s > 0 else [])
            + ([np.nansum(p[s:e, 1:s], axis=1, keepdims=True)] if s > 1 else [])
            + [p[s:e, s:e]]
        )
    if phantom is not None:
        blocks = [phantom[s:e, None]] + blocks
    return np.concatenate(blocks, axis=1)


def _query_slider(steps, axes_per_step, n: int) -> dict:
    """A slider over the windows of queries: each step shows its window's traces (one per head of ``n`` subplots)
    and sets every subplot's axes to that window's columns and rows."""
    out = []
    for j, ((s, e), (xcats, ycats)) in enumerate(zip(steps, axes_per_step)):
        vis = [jj == j for jj in range(len(steps)) for _ in range(n)]
        upd = {}
        for k in range(1, n + 1):
            upd[f"{_axis('xaxis', k)}.categoryarray"] = xcats
            upd[f"{_axis('xaxis', k)}.range"] = [-0.5, len(xcats) - 0.5]
            upd[f"{_axis('yaxis', k)}.categoryarray"] = ycats
            upd[f"{_axis('yaxis', k)}.range"] = [len(ycats) - 0.5, -0.5]
        out.append(dict(method="update", label=f"{s}–{e - 1}", args=[{"visible": vis}, upd]))
    return dict(active=0, steps=out, currentvalue=dict(prefix="queries "), pad=dict(t=110))  # below the rotated labels


def attention_view(
    pattern,
    phantom=None,
    tokens=None,
    *,
    heads=None,
    window: int = WINDOW,
    max_full: int = MAX_FULL,
    zmax: float = 1.0,
    title: str | None = None,
    cols: int = 4,
):
    """Attention patterns per head: rows = queries, columns = keys (plus the phantom as the first column when given).

    pattern: (H, T, T) over real keys (rows sum to 1 - phantom); phantom: (H, T) or None; tokens: T strings."""
    pattern = np.asarray(pattern, dtype=np.float32)
    H, T, _ = pattern.shape
    heads = list(range(H)) if heads is None else [int(h) for h in heads]
    if any(not 0 <= h < H for h in heads):
        raise ValueError(f"heads={heads}: the pattern has heads 0..{H - 1}")
    phantom = None if phantom is None else np.asarray(phantom, dtype=np.float32)
    labels = labels_of(tokens if tokens is not None else [str(i) for i in range(T)])
    n = len(heads)
    ncol = min(cols, n)
    nrow = -(-n // ncol)
    fig = make_subplots(
        rows=nrow,
        cols=ncol,
        subplot_titles=[f"head {h}" for h in heads],
        horizontal_spacing=0.12 / ncol,
        vertical_spacing=0.12 / nrow,
    )
    masked = np.where(np.tril(np.ones((T, T), dtype=bool))[None], pattern[heads], np.nan)  # (n, T, T)
    full = T <= max_full
    steps = [(0, T)] if full else spans(T, window)
    lead = ["phantom"] if phantom is not None else []
    axes_per_step = [_window_axes(labels, lead, s, e, full) for s, e in steps]
    for (s, e), (xcats, ycats) in zip(steps, axes_per_step):
        for i, h in enumerate(heads):
            fig.add_trace(
                go.Heatmap(
                    z=_window_cells(masked[i], None if phantom is None else phantom[h], s, e, full),
                    x=xcats,
                    y=ycats,
                    coloraxis="coloraxis",
                    visible=(s == 0),
                    hovertemplate="query %{y}<br>key %{x}<br>weight %{z:.4f}<extra>head " + str(h) + "</extra>",
                ),
                row=i // ncol + 1,
                col=i % ncol + 1,
            )
    layout = {}
    for k in range(1, n + 1):
        xcats, ycats = axes_per_step[0]
        layout[_axis("xaxis", k)] = dict(
            type="category",
            categoryorder="array",
            categoryarray=xcats,
            range=[-0.5, len(xcats) - 0.5],
            **TOKEN_TICKS,
            tickangle=-60,
        )
        layout[_axis("yaxis", k)] = dict(
            type="category", categoryorder="array", categoryarray=ycats, range=[len(ycats) - 0.5, -0.5], **TOKEN_TICKS
        )
    fig.update_layout(**layout)
    if not full:
        fig.update_layout(sliders=[_query_slider(steps, axes_per_step, n)])
    if np.nanmin(masked) < 0:  # differential attention's signed rows p1 - λ p2: a scale centred on 0
        top = max(zmax, float(np.nanmax(np.abs(masked))))
        scale = dict(colorscale=SIGNED, cmin=-top, cmax=top)
    else:
        scale = dict(colorscale="Blues", cmin=0, cmax=zmax)
    fig.update_layout(
        coloraxis=dict(**scale, colorbar=dict(title="attention")),
        title=title or "Attention patterns",
        height=max(420, 400 * nrow + (160 if not full else 0)),
    )
    return readable_category_ticks(fig)


def attention_picker_view(patterns, phantoms, tokens, *, title: str = "Attention pattern", layers=None) -> go.Figure:
    """One heatmap per (layer, head), trace ``i * H + head`` for the i-th pattern, only the first visible; ``layers``:
    the patterns' layer numbers (default 0, 1, ...: a hybrid model's softmax layers are not every layer). The figure
    carries plotly's own dropdown of every (layer, head), so it can be picked wherever the figure is shown (a
    notebook, a Dash app); a page (``probe.present.page.page``) replaces that menu with separate layer and head
    pickers. Rows = queries, columns = keys with the phantom first (when the model has one); each trace's colour scale
    runs from 0 to its own maximum, so a head with weights near 0.02 is not drawn blank."""
    T = len(tokens)
    labels = labels_of(tokens)
    lead = ["phantom"] if phantoms[0] is not None else []
    causal = np.tril(np.ones((T, T), dtype=bool))
    labels_l = list(range(len(patterns))) if layers is None else [int(l) for l in layers]
    fig = go.Figure()
    for i, (l, pattern, phantom) in enumerate(zip(labels_l, patterns, phantoms)):
        for h in range(pattern.shape[0]):
            z = np.where(causal, pattern[h], np.nan)  # T, T
            if phantom is not None:
                z = np.concatenate([phantom[h][:, None], z], axis=1)  # T, 1 + T
            top = float(np.nanmax(np.abs(z))) or 1.0
            signed = bool(np.nanmin(z) < 0)  # differential attention's rows p1 - λ p2: a scale centred on 0
            fig.add_trace(
                go.Heatmap(
                    z=z,
                    x=lead + labels,
                    y=labels,
                    zmin=-top if signed else 0,
                    zmax=top,
                    colorscale=SIGNED if signed else SEQUENTIAL,
                    colorbar=dict(title="attention"),
                    visible=(i == 0 and h == 0),
                    name=f"layer {l} head {h}",
                    hovertemplate="query %{y}<br>key %{x}<br>weight %{z:.4f}<extra>" + f"layer {l} head {h}</extra>",
                )
            )
    n = len(fig.data)
    # one button per (layer, head); each sets the visibility of every trace (n^2 booleans, far less than the data)
    menu = dict(
        type="dropdown",
        direction="down",
        x=1.0,
        y=1.01,
        xanchor="right",
        yanchor="bottom",
        showactive=True,
        active=0,
        buttons=[
            dict(label=t.name, method="restyle", args=[{"visible": [i == k for i in range(n)]}])
            for k, t in enumerate(fig.data)
        ],
    )
    px = 15  # per token row / column: room for an 11 px label
    fig.update_xaxes(
        type="category",
        title_text="key (phantom first)" if lead else "key",
        side="bottom",
        **TOKEN_TICKS,
        tickangle=-60,
    )
    fig.update_yaxes(type="category", title_text="query", autorange="reversed", **TOKEN_TICKS)
    fig.update_layout(
        title=title,
        height=max(500, px * T + 320),
        width=max(900, px * (T + len(lead)) + 340),
        margin=dict(l=140, b=160, t=140),
        updatemenus=[menu],
        meta={"picker": _picker(labels_l, patterns[0].shape[0])},
    )
    return readable_category_ticks(fig)


def _picker(layers: list[int], n_heads: int) -> list:
    """The page's pickers: [n_layers, n_heads], and the layer numbers when they are not 0 .. n_layers - 1."""
    return [len(layers), n_heads] + ([layers] if layers != list(range(len(layers))) else [])


__all__ = ["MAX_FULL", "attention_view", "attention_picker_view"]
