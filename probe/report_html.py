"""The HTML page of ``probe report``: one figure per statistic across models (or training steps), offline."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from probe.analyses.figures import training_figure
from probe.analyses.sink_heads import sink_eps_layers_figure, sink_eps_trend_figure
from probe.analyses.sinks import SINK_FACTOR, SINK_R0
from probe.output import html_page
from probe.runs import metrics_records

SUMMARY_STATS = [  # (column, title, reference column or None)
    ("pos0_share", "Mass on position 0 / mass on real keys (rows t >= 1)", "uniform_ref"),
    ("pos0_over_uniform", "Position-0 share over the causal-uniform reference (layers past the first)", None),
    ("phantom_share", "Phantom share of all attention mass", None),
    ("r0", "r0 = ||v0|| / median ||vj|| (mean over layers)", None),
    ("r0_later", "r0 over layers past the first", None),
]
LAYER_STATS = [("pos0_share", "Position-0 share per layer"), ("phantom_share", "Phantom share per layer"),
               ("r0", "r0 per layer")]


def _axis(summary):
    """x values and title: training steps when every entry is a step of one model, else the model names."""
    steps = summary["step"]
    bases = summary["model"].str.rsplit("@", n=1).str[0]
    if steps.notna().all() and bases.nunique() == 1:
        return {m: int(s) for m, s in zip(summary["model"], steps)}, f"training step of {bases.iloc[0]}"
    return {m: m for m in summary["model"]}, "model"


def report_figures(tables: dict) -> list[go.Figure]:
    summary = tables["summary"]
    xs, xtitle = _axis(summary)
    x = [xs[m] for m in summary["model"]]
    figs = []
    for col, title, ref in SUMMARY_STATS:
        fig = go.Figure(go.Scatter(x=x, y=summary[col], mode="lines+markers", name=col, text=summary["model"]))
        if ref:
            fig.add_trace(go.Scatter(x=x, y=summary[ref], mode="lines", name="causal-uniform reference",
                                     line=dict(dash="dot", color="gray")))
        if col == "pos0_over_uniform":
            fig.add_hline(y=SINK_FACTOR, line_dash="dot", line_color="gray", annotation_text="sink threshold")
        if col.startswith("r0"):
            fig.add_hline(y=SINK_R0, line_dash="dot", line_color="gray", annotation_text="sink threshold")
        fig.update_layout(title=title, xaxis_title=xtitle, yaxis_title=col)
        figs.append(fig)
    layers = tables["layers"]
    for col, title in LAYER_STATS:
        wide = layers.pivot_table(index="layer", columns="model", values=col, sort=False)
        wide = wide[[m for m in summary["model"] if m in wide.columns]]
        figs.append(go.Figure(go.Heatmap(z=wide.to_numpy(), x=[str(xs[m]) for m in wide.columns], y=list(wide.index),
                                         colorscale="Viridis", colorbar=dict(title=col)))
                    .update_layout(title=title, xaxis_title=xtitle, yaxis_title="layer"))
    if "sink_eps" in tables:
        figs.append(sink_eps_trend_figure(tables["sink_eps"]))
        figs.append(sink_eps_layers_figure(tables["sink_eps_layers"]))
    if "injection" in tables:
        inj = tables["injection"]
        fig = go.Figure()
        for (junk, cutoff, dose), g in inj.groupby(["junk", "cutoff", "dose"], sort=False):
            fig.add_trace(go.Scatter(x=[xs[m] for m in g["model"]], y=g["delta"], mode="lines+markers",
                                     name=f"{junk} ({cutoff}) ε={dose:g}", text=g["model"]))
        fig.update_layout(title="Loss increase under value-noise injection", xaxis_title=xtitle,
                          yaxis_title="loss increase (nats per token)")
        figs.append(fig)
    if "exposure" in tables:
        exp = tables["exposure"]
        fig = go.Figure()
        for cutoff, g in exp.groupby("cutoff", sort=False):
            fig.add_trace(go.Scatter(x=[xs[m] for m in g["model"]], y=g["quiet_share"], mode="lines+markers",
                                     name=f"quiet reads ({cutoff})"))
        first = exp.drop_duplicates("model")
        fig.add_trace(go.Scatter(x=[xs[m] for m in first["model"]], y=first["phantom_share"], mode="lines+markers",
                                 name="phantom"))
        fig.update_layout(title="Exposure: share of attention mass on quiet reads and on the phantom",
                          xaxis_title=xtitle, yaxis_title="share of attention mass")
        figs.append(fig)
    return figs


def report_page(tables: dict, records: list[dict], settings: dict) -> str:
    meta = records[0]["meta"] if records else {}
    intro = {"models": ", ".join(r["name"] for r in records), "corpus": meta.get("corpus"),
             "corpus fingerprint": meta.get("corpus_fingerprint"),
             "windows": f"{settings['batches']} batches x {settings['batch_size']} windows, ctx "
                        f"{settings['ctx'] or 'model default'}, mode {settings['window_mode']}, "
                        f"seed {settings['seed']}",
             "injection": settings["inject"] or "none", "device / dtype": f"{settings['device']} / {settings['dtype']}",
             "probe version": settings["probe_version"]}
    cols = ["model", "step", "model_id", "pos0_share", "uniform_ref", "pos0_over_uniform", "phantom_share", "r0",
            "r0_later", "sink_formed"]
    summary = tables["summary"][[c for c in cols if c in tables["summary"]]]
    shown = [("Summary (averages over rows t >= 1, heads, layers)", summary)]
    if "sink_eps" in tables:
        shown.append(("Sink^eps (Gu et al.)", tables["sink_eps"][["model", "step", "epsilon", "n_sink_heads", "n_heads",
                                                                 "sink_share", "key0_mass", "phantom_share"]]))
    if "injection" in tables:
        shown.append(("Injection", tables["injection"][["model", "step", "junk", "cutoff", "dose", "loss_clean",
                                                        "loss_corrupted", "delta"]]))
    return html_page("Attention-sink report", report_figures(tables) + _training_figures(records), intro=intro,
                     tables=shown)


def _training_figures(records: list[dict]) -> list[go.Figure]:
    """The training curves of every `probe train` run whose snapshots were reported (beside their sink trends)."""
    runs = dict.fromkeys(r["name"].rsplit("@", 1)[0] for r in records if "@" in r["name"])
    frames = {run: pd.DataFrame(metrics_records(Path(run).expanduser())) for run in runs}  # empty for hub revisions
    frames = {run: df for run, df in frames.items() if not df.empty}
    return [training_figure(frames)] if frames else []
