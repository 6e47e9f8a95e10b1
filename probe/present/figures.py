"""Plotly figures for the analyses: each takes the dict of tables an analysis returned (several may be given to
compare models) and returns a ``plotly.graph_objects.Figure``. ``write_html`` works offline."""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from probe.analyses.sinks import SINK_FACTOR, SINK_R0
from probe.analyses.stats import batch_se

ID_COLUMNS = ("model", "corpus")
# One orientation everywhere: layers (and read sites) run along the x axis, layer 0 at the left; heads, sources and
# models go on the y axis of heatmaps. Colour scales are colour-blind safe and fitted to the data's range.
SEQUENTIAL = "Viridis"
SIGNED = "RdBu"  # only for signed data, centred on 0
REFERENCE = dict(dash="dot", color="gray")


def _many(results):
    return [results] if isinstance(results, dict) else list(results)


def _name(res) -> str:
    return str(res["meta"]["model"].iloc[0])


def integer_ticks(fig: go.Figure, axis: str = "x", title: str = "layer", **where) -> go.Figure:
    """Whole-number ticks (layers, heads, read sites) on ``axis`` ("x" or "y") with its title."""
    update = fig.update_xaxes if axis == "x" else fig.update_yaxes
    update(title_text=title, tickmode="linear", tick0=0, dtick=1, tickformat="d", **where)
    return fig


def threshold(fig: go.Figure, y: float, label: str, **where) -> go.Figure:
    """A labelled horizontal threshold line."""
    fig.add_hline(y=y, line=REFERENCE, annotation_text=label, annotation_position="top left", **where)
    return fig


def fitted_heatmap(z, x, y, title: str, **kw) -> go.Heatmap:
    """Heatmap whose colour scale spans the data's range (signed data: RdBu centred on 0, else Viridis)."""
    z = np.asarray(z, dtype=float)
    lo, hi = (float(np.nanmin(z)), float(np.nanmax(z))) if np.isfinite(z).any() else (0.0, 1.0)
    signed = lo < 0 < hi
    span = dict(zmid=0, colorscale=SIGNED) if signed else dict(zmin=lo, zmax=hi if hi > lo else lo + 1e-12,
                                                               colorscale=SEQUENTIAL)
    return go.Heatmap(z=z, x=x, y=y, colorbar=dict(title=title), hoverongaps=False, **{**span, **kw})


def layer_se(batches: pd.DataFrame | None, key: str, by=("model", "layer")) -> pd.Series | None:
    """Standard error over evaluation batches of ``key`` per (model, layer); None without per-batch data."""
    if batches is None or batches.empty or key not in batches:
        return None
    se = batch_se(batches, [key], [c for c in by if c in batches], indexed=True)
    return None if se is None else se[f"{key}_se"]


def _error(se, keys) -> dict | None:
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


def depth_heatmap(result: dict) -> go.Figure:
    """Mean depth weights: read site (x) x source identity (y), colour clipped at the 99.5th percentile."""
    heat = result["heatmap"].drop(columns=[c for c in ID_COLUMNS if c in result["heatmap"]]).set_index("site")
    clip = float(result["summary"]["heatmap_clip"].iloc[0])
    fig = go.Figure(go.Heatmap(z=heat.to_numpy().T, x=list(heat.index), y=list(heat.columns), zmin=0, zmax=clip,
                               colorscale=SEQUENTIAL, colorbar=dict(title="mean α (weight)"), hoverongaps=False))
    fig.update_layout(title=f"Mean depth weights — {_name(result)} (colour clipped at {clip:.3g})",
                      xaxis_title="read site (depth order)", yaxis_title="source (depth order)")
    return fig


def effective_sources_figure(results) -> go.Figure:
    """N_eff per read site (± std over tokens) with the number of sources, one line per model."""
    fig = go.Figure()
    for res in _many(results):
        s = res["sites"]
        fig.add_trace(go.Scatter(x=s["site_index"], y=s["neff_mean"], mode="lines+markers", name=_name(res),
                                 error_y=dict(type="data", array=s["neff_std"], visible=True), text=s["site"]))
    s = _many(results)[0]["sites"]
    fig.add_trace(go.Scatter(x=s["site_index"], y=s["n_sources"], mode="lines", line=REFERENCE,
                             name="sources available at the site"))
    fig.update_layout(title="Effective number of sources (± std over tokens)",
                      yaxis_title="N_eff = exp(H(α)) (sources)", yaxis_rangemode="tozero")
    return integer_ticks(fig, "x", "read site (index in depth order)")


SINK_PANELS = (("pos0_share", "position-0 share", "share of real attention mass on key 0"),
               ("phantom_share", "phantom share", "share of all attention mass on the phantom"),
               ("r0", "r0 = ‖v0‖ / median ‖vj‖", "read-norm ratio (unitless)"))


def sink_profile_figure(layers: pd.DataFrame, batches: pd.DataFrame | None = None,
                        title: str = "Attention sinks per layer") -> go.Figure:
    """Per-layer profiles overlaid across models (one line per ``model``, ± s.e. over batches): position-0 share with
    the causal-uniform reference and the 3x sink threshold, phantom share, r0 with its 0.8 threshold."""
    fig = make_subplots(rows=1, cols=3, subplot_titles=[t for _, t, _ in SINK_PANELS], horizontal_spacing=0.07)
    colours = qualitative.Plotly
    for i, (model, lay) in enumerate(layers.groupby("model", sort=False)):
        colour = colours[i % len(colours)]
        for col, (key, _, _) in enumerate(SINK_PANELS, start=1):
            se = layer_se(batches[batches["model"] == model] if batches is not None and "model" in batches
                          else batches, key, by=("layer",))
            fig.add_trace(go.Scatter(x=lay["layer"], y=lay[key], mode="lines+markers", name=str(model),
                                     legendgroup=str(model), showlegend=col == 1, line=dict(color=colour),
                                     error_y=_error(se, lay["layer"])), row=1, col=col)
    ref = layers.drop_duplicates("layer").sort_values("layer")
    fig.add_trace(go.Scatter(x=ref["layer"], y=ref["uniform_ref"], mode="lines", line=REFERENCE,
                             name="causal-uniform reference"), row=1, col=1)
    fig.add_trace(go.Scatter(x=ref["layer"], y=SINK_FACTOR * ref["uniform_ref"], mode="lines",
                             line=dict(dash="dash", color="gray"), name=f"{SINK_FACTOR:g} x uniform (sink threshold)"),
                  row=1, col=1)
    threshold(fig, SINK_R0, f"r0 = {SINK_R0:g} (sink threshold)", row=1, col=3)
    for col, (_, _, unit) in enumerate(SINK_PANELS, start=1):
        fig.update_yaxes(title_text=unit, rangemode="tozero", row=1, col=col)
    integer_ticks(fig, "x", "layer")
    fig.update_layout(title=f"{title} (± standard error over batches)" if batches is not None else title,
                      legend=dict(orientation="h", y=-0.2))
    return fig


def sink_figure(results) -> go.Figure:
    """Per layer: position-0 share (with the causal-uniform reference), phantom share, r0; one line per model."""
    many = _many(results)
    layers = pd.concat([r["layers"].assign(model=_name(r)) for r in many], ignore_index=True)
    batches = [r["batches"].assign(model=_name(r)) for r in many if "batches" in r and len(r["batches"])]
    return sink_profile_figure(layers, pd.concat(batches, ignore_index=True) if batches else None)


def sink_heads_figure(result: dict, value: str = "pos0_share") -> go.Figure:
    """Layer (x) x head (y) heatmap of one sink statistic, colour fitted to its range."""
    h = result["heads"].pivot(index="head", columns="layer", values=value)
    fig = go.Figure(fitted_heatmap(h.to_numpy(), list(h.columns), list(h.index), value))
    fig.update_layout(title=f"{value} per head — {_name(result)}")
    integer_ticks(fig, "x", "layer")
    return integer_ticks(fig, "y", "head")


def gate_figure(results) -> go.Figure:
    """Per layer: attention-weighted mean gate, selectivity, and share of gate variance explained by token identity;
    one line per model, ± standard error over batches where the result has per-batch rows."""
    panels = (("mean_gate", "mean gate", "gate g (0 = closed, 1 = open)"),
              ("selectivity", "selectivity", "std of g under attention"),
              ("token_share", "token-identity share", "share of gate variance"))
    fig = make_subplots(rows=1, cols=3, subplot_titles=[t for _, t, _ in panels], horizontal_spacing=0.07)
    for res in _many(results):
        lay, batches = res["layers"], res.get("batches")
        for col, (key, _, _) in enumerate(panels, start=1):
            # token-identity share: a ratio of sums with its jackknife s.e. in the layers table
            bars = se_bars(lay, key) or _error(layer_se(batches, key, by=("layer",)), lay["layer"])
            fig.add_trace(go.Scatter(x=lay["layer"], y=lay[key], mode="lines+markers", name=_name(res),
                                     legendgroup=_name(res), showlegend=col == 1, error_y=bars),
                          row=1, col=col)
    for col, (_, _, unit) in enumerate(panels, start=1):
        fig.update_yaxes(title_text=unit, rangemode="tozero", row=1, col=col)
    integer_ticks(fig, "x", "layer")
    fig.update_layout(title="Value gates per layer")
    return fig


def gate_token_table(result: dict, k: int = 10) -> go.Figure:
    """The k most and k least attenuated tokens (mean gate over occurrences, layers and heads)."""
    tok = result["tokens"]
    low, high = tok.head(k), tok.tail(k).iloc[::-1]
    cells = [list(low["token"].map(repr)), [f"{x:.3f}" for x in low["mean_gate"]], list(low["count"]),
             list(high["token"].map(repr)), [f"{x:.3f}" for x in high["mean_gate"]], list(high["count"])]
    fig = go.Figure(go.Table(header=dict(values=["most attenuated", "gate", "count", "least attenuated", "gate",
                                                 "count"]), cells=dict(values=cells)))
    fig.update_layout(title=f"Mean gate per token — {_name(result)}")
    return fig


def injection_figure(results) -> go.Figure:
    """Dose-response: loss increase against dose (± s.e. over batches), one line per (model, junk type, cutoff)."""
    fig = go.Figure()
    doses = sorted({float(d) for res in _many(results) for d in res["results"]["dose"]})
    for res in _many(results):
        r, per_batch = res["results"], res.get("per_batch")
        se = None
        if per_batch is not None and len(per_batch):
            se = batch_se(per_batch.assign(cutoff=per_batch["cutoff"].astype(str)), ["delta"],
                          ["junk", "cutoff", "dose"], indexed=True)["delta_se"]
        for (junk, cutoff), g in r.groupby(["junk", "cutoff"], sort=False):
            g = g.sort_values("dose")
            keys = [(junk, str(cutoff), d) for d in g["dose"]]
            fig.add_trace(go.Scatter(x=g["dose"], y=g["delta"], mode="lines+markers", error_y=_error(se, keys),
                                     name=f"{_name(res)} · {junk} ({cutoff})"))
    threshold(fig, 0, "no change")
    fig.update_layout(title="Injected interference (± standard error over batches)", xaxis_title="dose ε (× median "
                      "read norm, log scale)", yaxis_title="loss increase (nats per token)", xaxis_type="log")
    # ticks at the doses run (a log axis would label 0.2 .. 0.9 as bare digits 2 .. 9)
    fig.update_xaxes(tickmode="array", tickvals=doses, ticktext=[f"{d:g}" for d in doses])
    return fig


def exposure_figure(results) -> go.Figure:
    """Share of attention mass on quiet reads (per cutoff) and on the phantom; models are categories, ± standard error
    over batches where the result has it."""
    fig = go.Figure()
    rows = []
    for res in _many(results):
        e = res["exposure"]
        for _, r in e.iterrows():
            rows.append((_name(res), f"quiet ({r['cutoff']})", r["quiet_share"], r.get("quiet_share_se")))
        rows.append((_name(res), "phantom", float(e["phantom_share"].iloc[0]), e.iloc[0].get("phantom_share_se")))
    df = pd.DataFrame(rows, columns=["model", "kind", "share", "share_se"])
    for kind, g in df.groupby("kind", sort=False):
        fig.add_trace(go.Bar(x=g["model"], y=g["share"], name=kind,
                             error_y=se_bars(g, "share") if g["share_se"].notna().any() else None))
    fig.update_layout(title="Exposure to injected junk", xaxis_title="model",
                      yaxis_title="share of attention mass (fraction of each row)", barmode="group")
    return fig


def paired_figure(summary: pd.DataFrame) -> go.Figure:
    """Mean paired improvement ± standard error per variant (from stats.paired_differences(...)['summary'])."""
    fig = go.Figure(go.Bar(x=summary["variant"], y=summary["mean"],
                           error_y=dict(type="data", array=summary["se"].fillna(0), visible=True),
                           text=[f"{i}/{n} improved" for i, n in zip(summary["n_improved"], summary["n"])]))
    fig.update_layout(title=f"Paired improvement over {summary['baseline'].iloc[0]} (± standard error over seeds)",
                      xaxis_title="variant", yaxis_title="improvement (baseline - variant)")
    return fig


def decomposition_figure(table: pd.DataFrame) -> go.Figure:
    """The abstention decomposition (stats.abstention_decomposition) as bars with standard errors."""
    t = table[table["quantity"] != "share"]
    fig = go.Figure(go.Bar(x=t["quantity"], y=t["mean"], error_y=dict(type="data", array=t["se"].fillna(0))))
    share = float(table.loc[table["quantity"] == "share", "mean"].iloc[0])
    fig.update_layout(title=f"Abstention decomposition (filter share {share:.0%})" if np.isfinite(share)
                      else "Abstention decomposition", xaxis_title="component",
                      yaxis_title="improvement over baseline (± s.e.)")
    return fig


TRAINING_PANELS = (("lr", "learning rate", "learning rate"), ("grad_norm", "gradient norm", "norm before clipping"))


def training_figure(runs) -> go.Figure:
    """Training curves against step: training and validation loss on one axis (top), learning rate and gradient norm
    (below), one colour per run; validation dashed with markers.

    ``runs``: a ``read_metrics`` DataFrame, or a dict {label: DataFrame} to compare runs (paired variants, say)."""
    runs = {"run": runs} if isinstance(runs, pd.DataFrame) else dict(runs)
    fig = make_subplots(rows=2, cols=2, specs=[[{"colspan": 2}, None], [{}, {}]], vertical_spacing=0.14,
                        subplot_titles=["training loss (solid) and validation loss (dashed)"]
                        + [title for _, title, _ in TRAINING_PANELS])
    colours = fig.layout.template.layout.colorway or [None]
    for i, (label, df) in enumerate(runs.items()):
        colour = colours[i % len(colours)]
        for col, kind, dash in (("loss", "training", "solid"), ("val_loss", "validation", "dash")):
            if col in df:
                d = df[["step", col]].dropna()
                fig.add_trace(go.Scatter(x=d["step"], y=d[col], name=f"{label} {kind}", legendgroup=str(label),
                                         mode="lines+markers" if col == "val_loss" else "lines",
                                         line=dict(color=colour, dash=dash)), row=1, col=1)
        for j, (col, _, _) in enumerate(TRAINING_PANELS):
            if col in df:
                d = df[["step", col]].dropna()
                fig.add_trace(go.Scatter(x=d["step"], y=d[col], name=str(label), legendgroup=str(label),
                                         showlegend=False, mode="lines", line=dict(color=colour)), row=2, col=j + 1)
    fig.update_xaxes(title_text="step")
    fig.update_yaxes(title_text="loss (nats per token)", row=1, col=1)
    for j, (_, _, axis) in enumerate(TRAINING_PANELS):
        fig.update_yaxes(title_text=axis, row=2, col=j + 1)
    fig.update_layout(title="Training", height=700)
    return fig


__all__ = ["depth_heatmap", "effective_sources_figure", "sink_figure", "sink_profile_figure", "sink_heads_figure",
           "gate_figure", "integer_ticks", "threshold", "fitted_heatmap", "layer_se", "se_bars",
           "gate_token_table", "injection_figure", "exposure_figure", "paired_figure", "decomposition_figure",
           "training_figure"]
