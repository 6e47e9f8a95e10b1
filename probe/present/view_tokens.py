"""Figures of one text's tokens: rows x tokens heatmaps (depth-attention weights per read site, value gates per layer)
and the text itself coloured by a gate; the token labels and ticks every viewer shares.

A text longer than ``window`` tokens keeps one heatmap whose x-range a slider moves in steps of ``window`` tokens;
``gate_text_view`` shows one page of lines per slider step. Token labels are ``"<position> <token>"`` (unique, so
repeated tokens keep their own column); ``<sink>`` is the learned sink token of ``sinktoken`` models (position 0).
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from probe.present.figures import SEQUENTIAL, SIGNED

WINDOW = 64
TICK_SIZE = 11  # px; smaller labels are unreadable on a laptop screen
TOKEN_TICKS = dict(tickfont=dict(size=TICK_SIZE), dtick=1)  # dtick 1: every token label drawn, none dropped
GATE_COLOURS = "Cividis"  # blue -> yellow: readable with red-green colour blindness (never red/green)


def display(tok: str) -> str:
    """A token as shown on an axis: newlines and tabs as symbols, a leading space (or an all-space token) as ␣."""
    s = tok.replace("\n", "↵").replace("\t", "⇥")
    if s.strip() == "":
        return s.replace(" ", "␣")
    return "␣" + s[1:] if s.startswith(" ") else s


def labels_of(tokens: list[str]) -> list[str]:
    """Unique axis labels ``"<position> <token>"``."""
    return [f"{i} {display(t)}" for i, t in enumerate(tokens)]


def spans(T: int, window: int) -> list[tuple[int, int]]:
    """[start, end) of each run of ``window`` positions (a slider's steps)."""
    return [(s, min(s + window, T)) for s in range(0, T, window)]


def _token_heatmap(
    z,
    row_labels,
    tokens,
    *,
    window,
    title,
    colorbar,
    zmin=None,
    zmax=None,
    colorscale="Viridis",
    separators=(),
    hover="row",
):
    """One heatmap, rows x tokens, whose x-range a slider moves by ``window`` tokens when the text is longer."""
    z = np.asarray(z, dtype=np.float32)
    T = z.shape[1]
    labels = labels_of(tokens)
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=labels,
            y=list(row_labels),
            zmin=zmin,
            zmax=zmax,
            colorscale=colorscale,
            colorbar=dict(title=colorbar),
            hovertemplate="token %{x}<br>" + hover + " %{y}<br>" + colorbar + " %{z:.4f}<extra></extra>",
        )
    )
    for y in separators:
        fig.add_hline(y=y - 0.5, line_color="white", line_width=2)
    fig.update_xaxes(type="category", **TOKEN_TICKS, tickangle=-60, range=[-0.5, min(window, T) - 0.5])
    fig.update_yaxes(type="category", autorange="reversed", **TOKEN_TICKS)
    if T > window:
        steps = [
            dict(method="relayout", label=f"{s}–{e - 1}", args=[{"xaxis.range": [s - 0.5, s + window - 0.5]}])
            for s, e in spans(T, window)
        ]
        fig.update_layout(
            sliders=[dict(active=0, steps=steps, currentvalue=dict(prefix="tokens "), pad=dict(t=110))]
        )  # below the rotated token labels
    fig.update_layout(title=title, height=max(360, 16 * len(row_labels) + (320 if T > window else 220)))
    return fig


def depth_view(
    weights: dict, sources: dict, tokens, *, window: int = WINDOW, title: str | None = None, signed: bool = False
):
    """Depth-attention weights per read site and token: rows = (site, source), columns = tokens. ``signed``: weights
    of any sign and size (a hyper-connected model's composed stream sources) on a diverging scale centred on 0, else
    weights in [0, 1]."""
    rows, labels, seps = [], [], []
    for site, w in weights.items():
        w = np.asarray(w, dtype=np.float32)
        if w.shape[1] != len(sources[site]):
            raise ValueError(f"{site}: {w.shape[1]} weights per token but {len(sources[site])} source labels")
        if rows:
            seps.append(len(labels))
        rows.append(w.T)
        labels += [f"{site} ← {src}" for src in sources[site]]
    z = np.concatenate(rows, axis=0)
    top = float(np.nanmax(np.abs(z))) if signed and z.size else 1.0
    return _token_heatmap(
        z,
        labels,
        tokens,
        window=window,
        zmin=-top if signed else 0,
        zmax=top,
        colorscale=SIGNED if signed else SEQUENTIAL,
        title=title or "Depth-attention weights",
        colorbar="c" if signed else "α",
        separators=seps,
        hover="read",
    )


def gate_view(gates: dict, tokens, *, per_head: bool = False, window: int = WINDOW, title: str | None = None):
    """Gate values over the text: rows = layers (mean over KV heads) or layer x KV head, columns = tokens."""
    rows, labels, seps = [], [], []
    for l, g in gates.items():
        g = np.asarray(g, dtype=np.float32)
        if per_head:
            if rows:
                seps.append(len(labels))
            rows += [g[:, h] for h in range(g.shape[1])]
            labels += [f"L{l} kv{h}" for h in range(g.shape[1])]
        else:
            rows.append(g.mean(1))
            labels.append(f"L{l}")
    z = np.stack(rows)
    lo, hi = float(np.nanmin(z)), float(np.nanmax(z))
    zmin, zmax = (0.0, 1.0) if lo >= 0 and hi <= 1 else (lo, hi)
    return _token_heatmap(
        z,
        labels,
        tokens,
        window=window,
        zmin=zmin,
        zmax=zmax,
        colorscale=GATE_COLOURS,
        title=title or "Value gates over the text",
        colorbar="gate",
        separators=seps,
        hover="layer",
    )


def gate_text_view(
    values,
    tokens,
    *,
    per_line: int = 16,
    lines: int = 16,
    title: str | None = None,
    zmin: float | None = None,
    zmax: float | None = None,
):
    """The text as coloured tokens (one gate value per token), ``per_line`` tokens a line; a slider pages through
    ``lines`` lines at a time for long texts (only one page's cells and text are drawn)."""
    v = np.asarray(values, dtype=np.float32).reshape(-1)
    T = len(v)
    if len(tokens) != T:
        raise ValueError(f"{T} values but {len(tokens)} tokens")
    lo, hi = float(np.nanmin(v)), float(np.nanmax(v))
    if zmin is None or zmax is None:
        zmin, zmax = (0.0, 1.0) if lo >= 0 and hi <= 1 else (lo, hi)
    n_lines = -(-T // per_line)
    grid = np.full((n_lines * per_line,), np.nan, dtype=np.float32)
    grid[:T] = v
    grid = grid.reshape(n_lines, per_line)
    text = np.array([display(t) for t in tokens] + [""] * (n_lines * per_line - T), dtype=object).reshape(
        n_lines, per_line
    )
    pages = spans(n_lines, lines)
    fig = go.Figure()
    for j, (a, b) in enumerate(pages):
        pos = np.arange(a * per_line, b * per_line).reshape(b - a, per_line)
        fig.add_trace(
            go.Heatmap(
                z=grid[a:b],
                text=text[a:b],
                customdata=pos,
                texttemplate="%{text}",
                textfont=dict(size=11),
                x=list(range(per_line)),
                y=list(range(a, b)),
                zmin=zmin,
                zmax=zmax,
                colorscale=GATE_COLOURS,
                colorbar=dict(title="gate"),
                xgap=1,
                ygap=1,
                visible=(j == 0),
                hovertemplate="token %{customdata}: %{text}<br>gate %{z:.4f}<extra></extra>",
            )
        )
    fig.update_xaxes(visible=False)
    fig.update_yaxes(autorange="reversed", title_text="line", tickfont=dict(size=TICK_SIZE), dtick=1)
    if len(pages) > 1:
        steps = [
            dict(method="update", label=f"lines {a}–{b - 1}", args=[{"visible": [jj == j for jj in range(len(pages))]}])
            for j, (a, b) in enumerate(pages)
        ]
        fig.update_layout(sliders=[dict(active=0, steps=steps, pad=dict(t=30))])
    fig.update_layout(title=title or "Gate values over the text", height=max(300, 28 * min(lines, n_lines) + 200))
    return fig


__all__ = [
    "WINDOW",
    "TICK_SIZE",
    "TOKEN_TICKS",
    "GATE_COLOURS",
    "display",
    "labels_of",
    "spans",
    "depth_view",
    "gate_view",
    "gate_text_view",
]
