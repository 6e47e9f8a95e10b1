"""Interactive, offline viewers of one text: attention patterns, depth-attention weights, value gates.

Every viewer returns a ``plotly.graph_objects.Figure`` (shown inline in Jupyter; ``viewer_html``/``write_viewer_html``
write a self-contained page with plotly.js inline, no network; a report can embed the figures like any other).
Each comes in two layers: ``*_view`` builds the figure from arrays (any source), ``*_viewer`` captures the arrays from a
model through the §3 hooks for one text (a string, tokenized without special tokens, or token ids) and calls it.

Long sequences stay light in a browser:
* attention: up to ``max_full`` tokens the whole T x T pattern per head; beyond, a slider steps through windows of
  ``window`` queries, each shown against its own keys plus three summary columns (the phantom, key 0 and the summed
  mass on keys 1..s-1 that fall before the window), so every row's mass is still accounted for; only one window's
  cells are drawn at a time and the stored data grow as T x window, not T².
* depth weights and gates: one heatmap (rows: read site x source, or layer [x KV head]; columns: tokens) whose x-range
  a slider moves in steps of ``window`` tokens; ``gate_text_view`` shows the text itself as coloured tokens, one page
  of lines per slider step.
Token labels are ``"<position> <token>"`` (unique, so repeated tokens keep their own column); ``<sink>`` is the learned
sink token of ``sinktoken`` models (position 0).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from probe.analyses.capture import model_device, token_text
from probe.analyses.gates import read_tokens_of
from probe.analyses.sources import depth_sites
from probe.hooks import names as hook_names
from probe.present.page import page
from probe.progress import plural
from probe.writes import atomic_write

DESCRIPTIONS = {"view.html": "probe view: attention pattern (layer and head pickers), depth weights, gates of one text"}
WINDOW = 64
MAX_FULL = 128
MAX_TOKENS = 1024  # default cut: a layer's captured pattern is H x T x T
TICK_SIZE = 11  # px; smaller labels are unreadable on a laptop screen
TOKEN_TICKS = dict(tickfont=dict(size=TICK_SIZE), dtick=1)  # dtick 1: every token label drawn, none dropped
GATE_COLOURS = "Cividis"  # blue -> yellow: readable with red-green colour blindness (never red/green)


# ------------------------------------------------------------------------------------------------------------ tokens


def _display(tok: str) -> str:
    """A token as shown on an axis: newlines and tabs as symbols, a leading space (or an all-space token) as ␣."""
    s = tok.replace("\n", "↵").replace("\t", "⇥")
    if s.strip() == "":
        return s.replace(" ", "␣")
    return "␣" + s[1:] if s.startswith(" ") else s


def prepare(model, text_or_ids, *, tokenizer=None, max_tokens: int | None = None):
    """(ids (1, T) on the model's device, token strings per read position, note) for one text; a string is tokenized
    with the model's tokenizer without special tokens; input beyond ``max_tokens`` (default min(1024, the model's
    context), as the evaluation windows of docs/definitions.md#evaluation-windows; at most the context) is cut and the
    note says so."""
    info = model.probe_info
    tok = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
    if isinstance(text_or_ids, str):
        if tok is None:
            raise ValueError(f"model {info.name!r} has no tokenizer: pass token ids or tokenizer=")
        ids = torch.tensor(tok(text_or_ids, add_special_tokens=False)["input_ids"], dtype=torch.long)
    else:
        ids = torch.as_tensor(text_or_ids, dtype=torch.long)
    ids = ids.reshape(-1)
    limit = min(max_tokens or MAX_TOKENS, info.n_ctx)
    note = ""
    if ids.numel() > limit:
        note = f"first {limit} of {ids.numel()} tokens"
        ids = ids[:limit]
    if ids.numel() < 1:
        raise ValueError("the text has no tokens")
    if int(ids.max()) >= info.vocab_size or int(ids.min()) < 0:  # e.g. another model's tokenizer
        raise ValueError(
            f"token id {int(ids.max())} is outside model {info.name!r}'s vocabulary "
            f"0..{info.vocab_size - 1}; use the model's own tokenizer"
        )
    ids = ids[None].to(model_device(model))
    toks = [token_text(tok, t) for t in read_tokens_of(info, ids.cpu())[0].tolist()]
    return ids, toks, note


def labels_of(tokens: list[str]) -> list[str]:
    """Unique axis labels ``"<position> <token>"``."""
    return [f"{i} {_display(t)}" for i, t in enumerate(tokens)]


def _steps(T: int, window: int) -> list[tuple[int, int]]:
    return [(s, min(s + window, T)) for s in range(0, T, window)]


def _axis(kind: str, k: int) -> str:
    return kind + ("" if k == 1 else str(k))


# ------------------------------------------------------------------------------------------------------------ attention


def capture_attention(model, text_or_ids, layer: int, *, tokenizer=None, max_tokens: int | None = None) -> dict:
    """One layer's pattern (H, T, T) and phantom (H, T) for one text, as numpy, with token strings."""
    info = model.probe_info
    if not 0 <= layer < info.n_layers:
        raise ValueError(f"layer={layer}: model {info.name!r} has layers 0..{info.n_layers - 1}")
    ids, toks, note = prepare(model, text_or_ids, tokenizer=tokenizer, max_tokens=max_tokens)
    names = {hook_names.attn(layer, "pattern"), hook_names.attn(layer, "phantom")}
    with torch.no_grad():
        _, cache = model.run_with_cache(ids, names_filter=lambda n: n in names)
    pattern = cache[hook_names.attn(layer, "pattern")][0].float().cpu().numpy()
    phantom = cache[hook_names.attn(layer, "phantom")][0].float().cpu().numpy()
    return {
        "pattern": pattern,
        "phantom": phantom if info.has_phantom else None,
        "tokens": toks,
        "note": note,
        "layer": layer,
        "model": info.name,
    }


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
    steps = [(0, T)] if full else _steps(T, window)
    lead = ["phantom"] if phantom is not None else []
    axes_per_step = []
    for s, e in steps:
        if full:
            xcats = lead + labels
        else:
            xcats = lead + ([labels[0]] if s > 0 else []) + ([f"keys 1–{s - 1} (sum)"] if s > 1 else []) + labels[s:e]
        ycats = labels[s:e]
        axes_per_step.append((xcats, ycats))
        for i, h in enumerate(heads):
            p = masked[i]
            if full:
                blocks = [p]
            else:
                blocks = (
                    ([p[s:e, :1]] if s > 0 else [])
                    + ([np.nansum(p[s:e, 1:s], axis=1, keepdims=True)] if s > 1 else [])
                    + [p[s:e, s:e]]
                )
            if phantom is not None:
                blocks = [phantom[h, s:e, None]] + blocks
            z = np.concatenate(blocks, axis=1)
            fig.add_trace(
                go.Heatmap(
                    z=z,
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
        sliders = []
        for j, (s, e) in enumerate(steps):
            xcats, ycats = axes_per_step[j]
            vis = [jj == j for jj in range(len(steps)) for _ in heads]
            upd = {}
            for k in range(1, n + 1):
                upd[f"{_axis('xaxis', k)}.categoryarray"] = xcats
                upd[f"{_axis('xaxis', k)}.range"] = [-0.5, len(xcats) - 0.5]
                upd[f"{_axis('yaxis', k)}.categoryarray"] = ycats
                upd[f"{_axis('yaxis', k)}.range"] = [len(ycats) - 0.5, -0.5]
            sliders.append(dict(method="update", label=f"{s}–{e - 1}", args=[{"visible": vis}, upd]))
        fig.update_layout(
            sliders=[dict(active=0, steps=sliders, currentvalue=dict(prefix="queries "), pad=dict(t=110))]
        )  # below the rotated token labels
    fig.update_layout(
        coloraxis=dict(colorscale="Blues", cmin=0, cmax=zmax, colorbar=dict(title="attention")),
        title=title or "Attention patterns",
        height=max(420, 400 * nrow + (160 if not full else 0)),
    )
    return fig


def attention_viewer(
    model, text_or_ids, layer: int, *, heads=None, tokenizer=None, max_tokens: int | None = None, **kw
):
    """Attention patterns of one layer for one text (phantom column for models with one)."""
    cap = capture_attention(model, text_or_ids, layer, tokenizer=tokenizer, max_tokens=max_tokens)
    key0 = "learned sink token" if model.probe_info.sink_token else "first token"
    title = (
        f"Attention, layer {layer} — {cap['model']} (key 0 = {key0}"
        + (", phantom = first column" if cap["phantom"] is not None else "")
        + (f"; {cap['note']}" if cap["note"] else "")
        + ")"
    )
    return attention_view(cap["pattern"], cap["phantom"], cap["tokens"], heads=heads, title=title, **kw)


# ----------------------------------------------------------------------------------------------------- rows x tokens


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
            for s, e in _steps(T, window)
        ]
        fig.update_layout(
            sliders=[dict(active=0, steps=steps, currentvalue=dict(prefix="tokens "), pad=dict(t=110))]
        )  # below the rotated token labels
    fig.update_layout(title=title, height=max(360, 16 * len(row_labels) + (320 if T > window else 220)))
    return fig


def capture_depth(model, text_or_ids, *, sites=None, tokenizer=None, max_tokens: int | None = None) -> dict:
    """Depth-attention weights (T, S) per read site for one text, with each site's source labels."""
    info = model.probe_info
    all_sites = depth_sites(info)
    sites = list(all_sites) if sites is None else list(sites)
    unknown = [s for s in sites if s not in all_sites]
    if unknown:
        raise ValueError(f"unknown read sites {unknown}; the model's sites are {list(all_sites)}")
    ids, toks, note = prepare(model, text_or_ids, tokenizer=tokenizer, max_tokens=max_tokens)
    names = {hook_names.depth_weights(s): s for s in sites}
    with torch.no_grad():
        _, cache = model.run_with_cache(ids, names_filter=lambda n: n in names)
    weights = {s: cache[hook_names.depth_weights(s)][0].float().cpu().numpy() for s in sites}
    return {
        "weights": weights,
        "sources": {s: all_sites[s] for s in sites},
        "tokens": toks,
        "note": note,
        "model": info.name,
    }


def depth_view(weights: dict, sources: dict, tokens, *, window: int = WINDOW, title: str | None = None):
    """Depth-attention weights per read site and token: rows = (site, source), columns = tokens."""
    rows, labels, seps = [], [], []
    for site, w in weights.items():
        w = np.asarray(w, dtype=np.float32)
        if w.shape[1] != len(sources[site]):
            raise ValueError(f"{site}: {w.shape[1]} weights per token but {len(sources[site])} source labels")
        if rows:
            seps.append(len(labels))
        rows.append(w.T)
        labels += [f"{site} ← {src}" for src in sources[site]]
    return _token_heatmap(
        np.concatenate(rows, axis=0),
        labels,
        tokens,
        window=window,
        zmin=0,
        zmax=1,
        title=title or "Depth-attention weights",
        colorbar="α",
        separators=seps,
        hover="read",
    )


def depth_viewer(model, text_or_ids, *, sites=None, tokenizer=None, max_tokens: int | None = None, **kw):
    """Depth-attention weights of every read site (or ``sites``) for one text."""
    cap = capture_depth(model, text_or_ids, sites=sites, tokenizer=tokenizer, max_tokens=max_tokens)
    title = f"Depth-attention weights per read site and token — {cap['model']}" + (
        f" ({cap['note']})" if cap["note"] else ""
    )
    return depth_view(cap["weights"], cap["sources"], cap["tokens"], title=title, **kw)


def capture_gates(model, text_or_ids, *, layers=None, tokenizer=None, max_tokens: int | None = None) -> dict:
    """Value gates (T, Hkv) per layer for one text (element-wise gates: mean over the head's coordinates)."""
    info = model.probe_info
    if not info.has_value_gate:
        raise ValueError(
            f"model {info.name!r} has no value gate (value_gate={info.value_gate!r}); the gate viewer needs hook_v_gate"
        )
    layers = list(range(info.n_layers)) if layers is None else [int(l) for l in layers]
    ids, toks, note = prepare(model, text_or_ids, tokenizer=tokenizer, max_tokens=max_tokens)
    names = {hook_names.attn(l, "v_gate"): l for l in layers}
    with torch.no_grad():
        _, cache = model.run_with_cache(ids, names_filter=lambda n: n in names)
    gates = {}
    for name, l in names.items():
        g = cache[name][0].float()
        gates[l] = (g.mean(-1) if g.dim() == 3 else g).cpu().numpy()  # (T, Hkv)
    return {"gates": gates, "tokens": toks, "note": note, "model": info.name, "value_gate": info.value_gate}


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
    text = np.array([_display(t) for t in tokens] + [""] * (n_lines * per_line - T), dtype=object).reshape(
        n_lines, per_line
    )
    pages = _steps(n_lines, lines)
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


def gate_viewer(
    model,
    text_or_ids,
    *,
    layers=None,
    per_head: bool = False,
    text_layer: int | str | None = None,
    tokenizer=None,
    max_tokens: int | None = None,
    **kw,
):
    """Gate values over the text for one text: the layers x tokens heatmap, or (``text_layer`` = a layer index or
    'mean') the text itself coloured by that layer's gate (mean over KV heads)."""
    cap = capture_gates(model, text_or_ids, layers=layers, tokenizer=tokenizer, max_tokens=max_tokens)
    note = f" ({cap['note']})" if cap["note"] else ""
    if text_layer is None:
        return gate_view(
            cap["gates"],
            cap["tokens"],
            per_head=per_head,
            title=f"Value gates ({cap['value_gate']}) over the text — {cap['model']}{note}",
            **kw,
        )
    if text_layer == "mean":
        values = np.mean([g.mean(1) for g in cap["gates"].values()], axis=0)
    else:
        if int(text_layer) not in cap["gates"]:
            raise ValueError(f"text_layer={text_layer} is not among the captured layers {list(cap['gates'])}")
        values = cap["gates"][int(text_layer)].mean(1)
    return gate_text_view(
        values,
        cap["tokens"],
        title=f"Gate ({cap['value_gate']}), layer {text_layer}, mean over KV heads — {cap['model']}{note}",
        **kw,
    )


# ------------------------------------------------------------------------------------------------------------ html


def capture_all_attention(model, text_or_ids, *, tokenizer=None, max_tokens: int | None = None) -> dict:
    """Every layer's pattern (H, T, T) and phantom (H, T) for one text, in one forward pass, as numpy."""
    info = model.probe_info
    ids, toks, note = prepare(model, text_or_ids, tokenizer=tokenizer, max_tokens=max_tokens)
    with torch.no_grad():
        _, cache = model.run_with_cache(ids, names_filter=lambda n: hook_names.is_attn(n, "pattern", "phantom"))
    patterns = [cache[hook_names.attn(l, "pattern")][0].float().cpu().numpy() for l in range(info.n_layers)]
    phantoms = [
        cache[hook_names.attn(l, "phantom")][0].float().cpu().numpy() if info.has_phantom else None
        for l in range(info.n_layers)
    ]
    return {"patterns": patterns, "phantoms": phantoms, "tokens": toks, "note": note, "model": info.name}


def attention_picker_view(patterns, phantoms, tokens, *, title: str = "Attention pattern") -> go.Figure:
    """One heatmap per (layer, head), trace ``layer * H + head``, only layer 0 head 0 visible. The figure carries
    plotly's own dropdown of every (layer, head), so it can be picked wherever the figure is shown (a notebook, a
    Dash app); ``viewer_html`` replaces that menu with separate layer and head pickers (``picker_html``). Rows =
    queries, columns = keys with the phantom first (when the model has one); each trace's colour scale runs from 0
    to its own maximum, so a head with weights near 0.02 is not drawn blank."""
    T = len(tokens)
    labels = labels_of(tokens)
    lead = ["phantom"] if phantoms[0] is not None else []
    causal = np.tril(np.ones((T, T), dtype=bool))
    fig = go.Figure()
    for l, (pattern, phantom) in enumerate(zip(patterns, phantoms)):
        for h in range(pattern.shape[0]):
            z = np.where(causal, pattern[h], np.nan)  # T, T
            if phantom is not None:
                z = np.concatenate([phantom[h][:, None], z], axis=1)  # T, 1 + T
            fig.add_trace(
                go.Heatmap(
                    z=z,
                    x=lead + labels,
                    y=labels,
                    zmin=0,
                    zmax=float(np.nanmax(z)) or 1.0,
                    colorscale="Viridis",
                    colorbar=dict(title="attention"),
                    visible=(l == 0 and h == 0),
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
        meta={"picker": [len(patterns), patterns[0].shape[0]]},
    )
    return fig


def picker_html(div_id: str, n_layers: int, n_heads: int) -> str:
    """Layer and head <select>s that show one (layer, head) trace of figure ``div_id`` (a few lines of inline
    JavaScript calling Plotly.restyle once the page is parsed; offline). Placed above the figure."""

    def options(n):
        return "".join(f"<option value='{i}'>{i}</option>" for i in range(n))

    return (
        f"<p class='pickers'><label>layer <select id='{div_id}-layer'>{options(n_layers)}</select></label> "
        f"<label>head <select id='{div_id}-head'>{options(n_heads)}</select></label></p>"
        "<script type='text/javascript'>document.addEventListener('DOMContentLoaded', function () {"
        f"var gd = document.getElementById('{div_id}'), L = {n_layers}, H = {n_heads};"
        f"var layer = document.getElementById('{div_id}-layer'), head = document.getElementById('{div_id}-head');"
        "function show() { var pick = (+layer.value) * H + (+head.value), vis = [];"
        " for (var i = 0; i < L * H; i++) vis.push(i === pick);"
        " Plotly.restyle(gd, {visible: vis}); }"
        "layer.addEventListener('change', show); head.addEventListener('change', show);"
        "});</script>"
    )


def view_figures(model, text_or_ids, *, tokenizer=None, max_tokens: int = MAX_FULL) -> tuple[list, dict]:
    """What ``probe view`` shows for one text — the attention pattern of any layer and head (``viewer_html`` adds
    the pickers), then depth weights (depth-routed models) and gates over the text (gated models) — and a summary
    of what was drawn."""
    info = model.probe_info
    cap = capture_all_attention(model, text_or_ids, tokenizer=tokenizer, max_tokens=max_tokens)
    H = cap["patterns"][0].shape[0]
    note = f" ({cap['note']})" if cap["note"] else ""
    key0 = "learned sink token" if info.sink_token else "first token"
    att = attention_picker_view(
        cap["patterns"],
        cap["phantoms"],
        cap["tokens"],
        title=(
            f"Attention pattern of the layer and head picked above — {cap['model']}<br><sup>key 0 = {key0}"
            + ("; phantom = first column" if cap["phantoms"][0] is not None else "")
            + f"{note}</sup>"
        ),
    )
    shown = [att]
    summary = {
        "model": cap["model"],
        "tokens": len(cap["tokens"]),
        "layers": info.n_layers,
        "heads": H,
        "phantom": cap["phantoms"][0] is not None,
        "depth": False,
        "gates": False,
        "note": cap["note"],
    }
    if info.has_depth_sources and info.extra.get("depth_sites"):
        shown.append(depth_viewer(model, text_or_ids, tokenizer=tokenizer, max_tokens=max_tokens))
        summary["depth"] = True
    if info.has_value_gate:
        shown.append(gate_viewer(model, text_or_ids, tokenizer=tokenizer, max_tokens=max_tokens))
        shown.append(gate_viewer(model, text_or_ids, text_layer="mean", tokenizer=tokenizer, max_tokens=max_tokens))
        summary["gates"] = True
    return shown, summary


def viewer_html(figures, title: str = "probe viewer", *, self_contained: bool = True) -> str:
    """One offline HTML page on the shared skeleton (``probe.present.page.page``): plotly.js (inline, or with
    ``self_contained=False`` the folder's shared plotly.min.js), then every figure; a figure from
    ``attention_picker_view`` gets its layer and head pickers."""
    figures = [figures] if not isinstance(figures, (list, tuple)) else list(figures)
    body = []
    for i, fig in enumerate(figures):
        div, meta = f"figure-{i}", fig.layout.meta
        picker = meta.get("picker") if isinstance(meta, dict) else None
        width = f"{fig.layout.width}px" if fig.layout.width else "100%"
        if picker:  # the page's layer and head <select>s replace the figure's one-list dropdown
            fig = go.Figure(fig)
            fig.layout.updatemenus = ()  # (update_layout would merge an empty list into the old menus)
        body.append(
            (picker_html(div, *picker) if picker else "")
            + fig.to_html(full_html=False, include_plotlyjs=False, default_width=width, div_id=div)
        )
    return page(title, blocks=body, self_contained=self_contained)


def view_text(path, summary: dict, source: str) -> str:
    """`probe view`'s one line: the page, what it shows of which text, the model's size."""
    shown = ["attention (layer and head pickers" + (", phantom column" if summary["phantom"] else "") + ")"]
    shown += ["depth weights"] * summary["depth"] + ["gates over the text"] * summary["gates"]
    return (
        f"{path}: {plural(summary['tokens'], 'token')} of {source}"
        + (f" ({summary['note']})" if summary["note"] else "")
        + f"; {', '.join(shown)}; "
        f"{plural(summary['layers'], 'layer')} x {plural(summary['heads'], 'head')}"
    )


def static_images(width: int = 900, height: int = 500) -> bool:
    """In a notebook: every figure shown from now on also carries a PNG (kaleido drawing it in Chromium), so it shows
    on GitHub and nbviewer, which run no JavaScript. True when a Chromium was found; without one figures stay
    interactive only (no error: a user's machine need not have a browser kaleido can drive)."""
    import shutil

    import plotly.io as pio

    if not any(shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome", "chrome")):
        return False
    import warnings

    from probe.console import note
    from probe.optional import disable_if_broken, status

    if disable_if_broken("kaleido", note) or status("kaleido") == "absent":
        return False  # a broken kaleido: one warning; none installed: nothing to say
    import kaleido

    try:
        kaleido.start_sync_server(silence_warnings=True)  # one browser for every image, not one per figure
    except Exception as e:  # noqa: BLE001 - a browser kaleido cannot drive: figures stay interactive
        note(f"warning: kaleido cannot start its browser ({type(e).__name__}); figures stay interactive only")
        return False
    # plotly passes its (default) kaleido options along, which the server ignores: harmless, and said once per figure
    warnings.filterwarnings("ignore", message="The kopts argument is ignored if using a server")
    # The browser tab loads kaleido's scripts while the first image is asked for; on a busy machine that first call can
    # fail ("kaleido_scopes is not defined"). Draw a blank figure first, a few tries, so a notebook's figures never do.
    import plotly.graph_objects as go

    for attempt in range(3):
        try:
            pio.to_image(go.Figure(), format="png", width=10, height=10)
            break
        except Exception:  # noqa: BLE001 - kaleido raises its own JavaScript errors; the next try is the remedy
            if attempt == 2:
                raise
    pio.renderers["png"].width, pio.renderers["png"].height = width, height
    pio.renderers.default = "plotly_mimetype+png"
    return True


def write_viewer_html(figures, path, title: str = "probe viewer") -> Path:
    path = Path(path)
    atomic_write(path, viewer_html(figures, title))
    return path


__all__ = [
    "prepare",
    "labels_of",
    "capture_attention",
    "attention_view",
    "attention_viewer",
    "capture_depth",
    "depth_view",
    "depth_viewer",
    "capture_gates",
    "gate_view",
    "gate_text_view",
    "gate_viewer",
    "viewer_html",
    "write_viewer_html",
    "capture_all_attention",
    "attention_picker_view",
    "picker_html",
    "view_figures",
    "static_images",
    "WINDOW",
    "MAX_FULL",
]
