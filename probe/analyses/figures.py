"""Plotly figures for the analyses: each takes the dict of tables an analysis returned (several may be given to
compare models) and returns a ``plotly.graph_objects.Figure``. ``write_html`` works offline."""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

ID_COLUMNS = ("model", "corpus")


def _many(results):
    return [results] if isinstance(results, dict) else list(results)


def _name(res) -> str:
    return str(res["meta"]["model"].iloc[0])


def depth_heatmap(result: dict) -> go.Figure:
    """Mean depth weights: read site x source identity, colour clipped at the 99.5th percentile of valid cells."""
    heat = result["heatmap"].drop(columns=[c for c in ID_COLUMNS if c in result["heatmap"]]).set_index("site")
    clip = float(result["summary"]["heatmap_clip"].iloc[0])
    fig = go.Figure(go.Heatmap(z=heat.to_numpy(), x=list(heat.columns), y=list(heat.index), zmin=0, zmax=clip,
                               colorscale="Viridis", colorbar=dict(title="mean α"), hoverongaps=False))
    fig.update_layout(title=f"Mean depth weights — {_name(result)} (clipped at {clip:.3g})",
                      xaxis_title="source", yaxis_title="read site", yaxis_autorange="reversed")
    return fig


def effective_sources_figure(results) -> go.Figure:
    """N_eff per read site (± std over tokens) with the number of sources, one line per model."""
    fig = go.Figure()
    for res in _many(results):
        s = res["sites"]
        fig.add_trace(go.Scatter(x=s["site_index"], y=s["neff_mean"], mode="lines+markers", name=_name(res),
                                 error_y=dict(type="data", array=s["neff_std"], visible=True), text=s["site"]))
    s = _many(results)[0]["sites"]
    fig.add_trace(go.Scatter(x=s["site_index"], y=s["n_sources"], mode="lines", line=dict(dash="dot", color="gray"),
                             name="sources at site"))
    fig.update_layout(title="Effective number of sources", xaxis_title="read site", yaxis_title="N_eff = exp(H(α))")
    return fig


def sink_figure(results) -> go.Figure:
    """Per layer: position-0 share (with the causal-uniform reference), phantom share, r0; one bar series per model."""
    fig = make_subplots(rows=1, cols=3, subplot_titles=("mass on position 0 / real mass", "phantom share",
                                                        "r0 = ‖v0‖ / median ‖vj‖"))
    for res in _many(results):
        lay = res["layers"]
        for col, key in enumerate(("pos0_share", "phantom_share", "r0"), start=1):
            fig.add_trace(go.Bar(x=lay["layer"], y=lay[key], name=_name(res), legendgroup=_name(res),
                                 showlegend=col == 1), row=1, col=col)
    lay = _many(results)[0]["layers"]
    fig.add_trace(go.Scatter(x=lay["layer"], y=lay["uniform_ref"], mode="lines", line=dict(dash="dot", color="gray"),
                             name="causal-uniform"), row=1, col=1)
    fig.add_hline(y=0.8, line_dash="dot", line_color="gray", row=1, col=3)
    fig.update_xaxes(title_text="layer")
    fig.update_layout(title="Attention sinks", barmode="group")
    return fig


def sink_heads_figure(result: dict, value: str = "pos0_share") -> go.Figure:
    """Layer x head heatmap of one sink statistic."""
    h = result["heads"].pivot(index="layer", columns="head", values=value)
    fig = go.Figure(go.Heatmap(z=h.to_numpy(), x=list(h.columns), y=list(h.index), colorscale="Viridis",
                               colorbar=dict(title=value)))
    fig.update_layout(title=f"{value} per head — {_name(result)}", xaxis_title="head", yaxis_title="layer")
    return fig


def gate_figure(results) -> go.Figure:
    """Per layer: attention-weighted mean gate, selectivity, and share of gate variance explained by token identity."""
    fig = make_subplots(rows=1, cols=3, subplot_titles=("mean gate", "selectivity", "token-identity share"))
    for res in _many(results):
        lay = res["layers"]
        for col, key in enumerate(("mean_gate", "selectivity", "token_share"), start=1):
            fig.add_trace(go.Bar(x=lay["layer"], y=lay[key], name=_name(res), legendgroup=_name(res),
                                 showlegend=col == 1), row=1, col=col)
    fig.update_xaxes(title_text="layer")
    fig.update_layout(title="Value gates", barmode="group")
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
    """Dose-response: loss increase against dose, one line per (model, junk type, cutoff)."""
    fig = go.Figure()
    for res in _many(results):
        r = res["results"]
        for (junk, cutoff), g in r.groupby(["junk", "cutoff"], sort=False):
            g = g.sort_values("dose")
            fig.add_trace(go.Scatter(x=g["dose"], y=g["delta"], mode="lines+markers",
                                     name=f"{_name(res)} · {junk} ({cutoff})"))
    fig.update_layout(title="Injected interference", xaxis_title="dose ε", yaxis_title="loss increase (nats)",
                      xaxis_type="log")
    return fig


def exposure_figure(results) -> go.Figure:
    """Share of attention mass on quiet reads (per cutoff) and on the phantom, one group per model."""
    fig = go.Figure()
    rows = []
    for res in _many(results):
        for _, e in res["exposure"].iterrows():
            rows.append((_name(res), f"quiet ({e['cutoff']})", e["quiet_share"]))
        rows.append((_name(res), "phantom", float(res["exposure"]["phantom_share"].iloc[0])))
    df = pd.DataFrame(rows, columns=["model", "kind", "share"])
    for kind, g in df.groupby("kind", sort=False):
        fig.add_trace(go.Bar(x=g["model"], y=g["share"], name=kind))
    fig.update_layout(title="Exposure to injected junk", yaxis_title="share of attention mass", barmode="group")
    return fig


def paired_figure(summary: pd.DataFrame) -> go.Figure:
    """Mean paired improvement ± standard error per variant (from stats.paired_differences(...)['summary'])."""
    fig = go.Figure(go.Bar(x=summary["variant"], y=summary["mean"],
                           error_y=dict(type="data", array=summary["se"].fillna(0), visible=True),
                           text=[f"{i}/{n} improved" for i, n in zip(summary["n_improved"], summary["n"])]))
    fig.update_layout(title=f"Paired improvement over {summary['baseline'].iloc[0]}", yaxis_title="improvement")
    return fig


def decomposition_figure(table: pd.DataFrame) -> go.Figure:
    """The abstention decomposition (stats.abstention_decomposition) as bars with standard errors."""
    t = table[table["quantity"] != "share"]
    fig = go.Figure(go.Bar(x=t["quantity"], y=t["mean"], error_y=dict(type="data", array=t["se"].fillna(0))))
    share = float(table.loc[table["quantity"] == "share", "mean"].iloc[0])
    fig.update_layout(title=f"Abstention decomposition (filter share {share:.0%})" if np.isfinite(share)
                      else "Abstention decomposition", yaxis_title="improvement over baseline")
    return fig


TRAINING_PANELS = (("loss", "training loss"), ("val_loss", "validation loss"), ("lr", "learning rate"),
                   ("grad_norm", "gradient norm"))


def training_figure(runs) -> go.Figure:
    """Training curves against step: loss, validation loss, learning rate and gradient norm, one colour per run.

    ``runs``: a ``read_metrics`` DataFrame, or a dict {label: DataFrame} to compare runs (paired variants, say)."""
    runs = {"run": runs} if isinstance(runs, pd.DataFrame) else dict(runs)
    fig = make_subplots(rows=2, cols=2, subplot_titles=[title for _, title in TRAINING_PANELS])
    colours = fig.layout.template.layout.colorway or [None]
    for i, (label, df) in enumerate(runs.items()):
        for j, (col, _) in enumerate(TRAINING_PANELS):
            if col not in df:
                continue
            d = df[["step", col]].dropna()
            fig.add_trace(go.Scatter(x=d["step"], y=d[col], name=str(label), legendgroup=str(label), showlegend=j == 0,
                                     mode="lines+markers" if col == "val_loss" else "lines",
                                     line=dict(color=colours[i % len(colours)])), row=j // 2 + 1, col=j % 2 + 1)
    fig.update_xaxes(title_text="step")
    fig.update_layout(title="Training", height=600)
    return fig


__all__ = ["depth_heatmap", "effective_sources_figure", "sink_figure", "sink_heads_figure", "gate_figure",
           "gate_token_table", "injection_figure", "exposure_figure", "paired_figure", "decomposition_figure",
           "training_figure"]
