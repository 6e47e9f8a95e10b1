"""The HTML page of ``probe report``: verdict lines and tables first, then one figure per statistic across models or
training steps, offline.

Models are categories (dots with standard errors over evaluation batches; no lines join unrelated models);
checkpoints of one run are lines over the training step. Per-layer profiles are overlaid across models, layers on
the x axis as in every figure (``probe.present.figures``). Every threshold line is labelled."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from probe.analyses.sinks import SINK_FACTOR, SINK_R0
from probe.analyses.stats import batch_se
from probe.present.figures import integer_ticks, se_bars, threshold
from probe.present.files import show
from probe.present.glossary import glossed
from probe.present.page import page
from probe.present.report_mechanisms import mechanism_columns, mechanism_figures, mechanism_sections
from probe.present.sections import linear_note
from probe.present.sinks import sink_profile_figure
from probe.present.terminal import note_lines
from probe.present.training import training_figure
from probe.runs import metrics_records

# One line on each file of this analysis an output folder may hold (probe.present.page's index.html shows them)
DESCRIPTIONS = {
    "report.html": "report: summary tables, figures across models or training steps",
    "report_summary.csv": "report: sink statistics per model or checkpoint",
    "report_by_type.csv": "report: sink statistics per layer type",
    "report_layers.csv": "report: sink statistics per model and layer",
    "report_heads.csv": "report: sink statistics per model, layer and head",
    "report_batches.csv": "report: sink statistics per model, batch and layer",
    "report_sink_eps.csv": "report: Sink^eps per model",
    "report_sink_eps_layers.csv": "report: Sink^eps per model and layer",
    "report_injection.csv": "report: loss increase under injection per model and condition",
    "report_exposure.csv": "report: exposure per model",
    "report_massive.csv": "report (--massive): massive activations per model: the largest, where, its ratio to the "
    "median",
    "report_massive_layers.csv": "report (--massive): massive activations per model, layer and site",
    "report_entropy.csv": "report (--entropy): attention entropy per model, nats and / log outcomes (Zhai et al.)",
    "report_entropy_layers.csv": "report (--entropy): attention entropy per model and layer",
    "report_entropy_heads.csv": "report (--entropy): attention entropy per model, layer and head",
    "report_kurtosis.csv": "report (--kurtosis): outlier kurtosis of neuron RMS per model (He et al.)",
    "report_kurtosis_layers.csv": "report (--kurtosis): outlier kurtosis per model and layer",
    "report_norm_weighted.csv": "report (--norm-weighted): key 0's share by weight and by norm per model "
    "(Kobayashi et al.)",
    "report_norm_weighted_layers.csv": "report (--norm-weighted): key 0's shares per model and layer",
    "report_norm_weighted_heads.csv": "report (--norm-weighted): key 0's shares per model, layer and head",
    "report_ctx_summary.csv": "report over several --ctx: per model and context length T, position-0 share, "
    "causal-uniform reference, r0, Sink^eps share",
    "report_ctx_by_type.csv": "report over several --ctx: per model, context length and layer type (means over layers)",
    "report_ctx_layers.csv": "report over several --ctx: per model, context length and layer",
    "manifest.json": "report settings and model list (a resumed run must match them)",
}


SUMMARY_STATS = [  # (column, title, axis title with unit, threshold or None)
    ("pos0_share", "Mass on position 0 / mass on real keys (rows t >= 1)", "share of real attention mass", None),
    (
        "pos0_over_uniform",
        "Position-0 share over the causal-uniform reference (layers past the first)",
        "ratio to causal-uniform (x)",
        (SINK_FACTOR, f"{SINK_FACTOR:g}x uniform (sink threshold)"),
    ),
    ("phantom_share", "Phantom share of all attention mass", "share of all attention mass", None),
    (
        "r0_later",
        "r0 = ||v0|| / median ||vj|| over layers past the first",
        "read-norm ratio (unitless)",
        (SINK_R0, f"r0 = {SINK_R0:g} (sink threshold)"),
    ),
]
# summary column <- (per-batch column, over the layers past the first only)
BATCH_STATS = {"pos0_share": ("pos0_share", False), "phantom_share": ("phantom_share", False), "r0_later": ("r0", True)}


def _axis(summary):
    """x values and title: training steps when every entry is a step of one model, else the model names."""
    steps = summary["step"]
    bases = summary["model"].str.rsplit("@", n=1).str[0]
    if steps.notna().all() and bases.nunique() == 1:
        return {m: int(s) for m, s in zip(summary["model"], steps)}, f"training step of {bases.iloc[0]}"
    return {m: m for m in summary["model"]}, "model"


def _summary_se(batches: pd.DataFrame | None, col: str) -> dict:
    """Per model: standard error over batches of the per-batch mean over layers (past the first, for r0_later)."""
    if batches is None or col not in BATCH_STATS:
        return {}
    key, later = BATCH_STATS[col]
    out = {}
    for model, b in batches.groupby("model", sort=False):
        b = b[b["layer"] > 0] if later and b["layer"].nunique() > 1 else b
        out[model] = float(batch_se(b, [key], by=None)[f"{key}_se"].iloc[0])
    return out


def across(
    xs: dict, by_step: bool, rows: pd.DataFrame, value: str, name: str, se: dict | None = None, **style
) -> go.Scatter:
    """One series across models (dots with error bars) or training steps (a line)."""
    err = [se.get(m, float("nan")) for m in rows["model"]] if se else None
    return go.Scatter(
        x=[xs[m] for m in rows["model"]],
        y=rows[value],
        mode="lines+markers" if by_step else "markers",
        name=name,
        text=rows["model"],
        marker=dict(size=9, color=style.get("line", {}).get("color")),
        error_y=dict(type="data", array=err, visible=True) if err else None,
        **style,
    )


def _column_se(rows: pd.DataFrame, value: str) -> dict:
    """Per model: the ``<value>_se`` column the analysis wrote (absent in older saved records: no bars)."""
    if f"{value}_se" not in rows:
        return {}
    return dict(zip(rows["model"], pd.to_numeric(rows[f"{value}_se"], errors="coerce").astype(float)))


def report_figures(tables: dict) -> list[go.Figure]:
    summary = tables["summary"]
    xs, xtitle = _axis(summary)
    by_step = xtitle != "model"
    batches = tables.get("batches")
    figs = []
    for col, title, unit, line in SUMMARY_STATS:
        se = _summary_se(batches, col)
        fig = go.Figure(across(xs, by_step, summary, col, col, se))
        if col == "pos0_share":
            fig.add_trace(
                across(
                    xs, by_step, summary, "uniform_ref", "causal-uniform reference", line=dict(dash="dot", color="gray")
                )
            )
        if line:
            threshold(fig, *line)
        fig.update_layout(
            title=title + (" (± standard error over batches)" if se else ""),
            xaxis_title=xtitle,
            yaxis_title=unit,
            yaxis_rangemode="tozero",
        )
        if not by_step:
            fig.update_xaxes(type="category")
        figs.append(fig)
    figs.append(sink_profile_figure(tables["layers"], batches, "Attention sinks per layer, overlaid across models"))
    if "sink_eps" in tables:
        figs += _sink_eps_figures(tables, xs, by_step, xtitle)
    if "injection" in tables:
        figs.append(_injection_figure(tables, xs, by_step, xtitle))
    if "exposure" in tables:
        exp = tables["exposure"]
        fig = go.Figure()
        for cutoff, g in exp.groupby("cutoff", sort=False):
            fig.add_trace(
                across(xs, by_step, g, "quiet_share", f"quiet reads ({cutoff})", _column_se(g, "quiet_share"))
            )
        ph = exp.drop_duplicates("model")
        fig.add_trace(across(xs, by_step, ph, "phantom_share", "phantom", _column_se(ph, "phantom_share")))
        se = " (± s.e. over batches)" if "quiet_share_se" in exp else ""
        fig.update_layout(
            title="Exposure: share of attention mass on quiet reads and on the phantom" + se,
            xaxis_title=xtitle,
            yaxis_title="share of attention mass",
            yaxis_rangemode="tozero",
        )
        figs.append(fig)
    return figs + mechanism_figures(tables, xs, by_step, xtitle, across)


def _sink_eps_figures(tables, xs, by_step, xtitle) -> list[go.Figure]:
    """Sink^ε share across models (one series per ε) and per layer at the smallest ε (one line per model),
    ± jackknife s.e. over batches where the saved tables have it."""
    trend = go.Figure()
    for e, g in tables["sink_eps"].groupby("epsilon", sort=False):
        trend.add_trace(across(xs, by_step, g, "sink_share", f"ε = {e:g}", _column_se(g, "sink_share")))
    se = " (± jackknife s.e. over batches)" if "sink_share_se" in tables["sink_eps"] else ""
    trend.update_layout(
        title="Sink^ε: share of heads whose mean attention on key 0 exceeds ε" + se,
        xaxis_title=xtitle,
        yaxis_title="share of heads",
        yaxis_range=[0, 1.02],
    )
    layers = tables["sink_eps_layers"]
    e = float(layers["epsilon"].min())
    prof = go.Figure()
    for model, g in layers[layers["epsilon"] == e].groupby("model", sort=False):
        prof.add_trace(
            go.Scatter(
                x=g["layer"], y=g["sink_share"], mode="lines+markers", name=str(model), error_y=se_bars(g, "sink_share")
            )
        )
    prof.update_layout(
        title=f"Share of sink heads per layer (Sink^ε, ε = {e:g})" + se,
        yaxis_title="share of heads",
        yaxis_range=[0, 1.02],
    )
    return [trend, integer_ticks(prof, "x", "layer")]


def _injection_figure(tables, xs, by_step, xtitle) -> go.Figure:
    inj = tables["injection"]
    per_batch = tables.get("injection_batches")
    fig = go.Figure()
    for (junk, cutoff, dose), g in inj.groupby(["junk", "cutoff", "dose"], sort=False):
        se = {}
        if per_batch is not None:
            pb = per_batch[
                (per_batch["junk"] == junk)
                & (per_batch["cutoff"].astype(str) == str(cutoff))
                & (per_batch["dose"] == dose)
            ]
            se = batch_se(pb, ["delta"], by="model", indexed=True)
            se = {} if se is None else se["delta_se"].to_dict()
        fig.add_trace(across(xs, by_step, g, "delta", f"{junk} ({cutoff}) ε={dose:g}", se))
    threshold(fig, 0, "no change")
    fig.update_layout(
        title="Loss increase under value-noise injection" + (" (± s.e. over batches)" if per_batch is not None else ""),
        xaxis_title=xtitle,
        yaxis_title="loss increase (nats per token)",
    )
    return fig


def _readable_summary(summary: pd.DataFrame, batches: pd.DataFrame | None = None) -> pd.DataFrame:
    """The summary as people read it: the figures' standard errors beside their values, no model_id column when it
    repeats the model, no step column of None."""
    summary = summary.assign(
        **{f"{col}_se": summary["model"].map(se) for col in BATCH_STATS if (se := _summary_se(batches, col))}
    )
    cols = [
        "model",
        "step",
        "model_id",
        "pos0_share",
        "pos0_share_se",
        "uniform_ref",
        "pos0_over_uniform",
        "phantom_share",
        "phantom_share_se",
        "r0",
        "r0_later",
        "r0_later_se",
        "sink_formed",
    ]
    table = summary[[c for c in cols if c in summary]]
    if "model_id" in table and (table["model_id"].astype(str) == table["model"].astype(str)).all():
        table = table.drop(columns="model_id")
    if "model_id" in table:
        table = table.rename(columns={"model_id": "loaded as"})
    return table.loc[:, [c for c in table.columns if table[c].notna().any()]]


def linear_notes(layers: pd.DataFrame | None) -> list[str]:
    """One note per hybrid model of the report (its linear layers listed in the per-layer table): which layers its
    attention statistics and their means over layers leave out."""
    if layers is None or "layer_type" not in layers:
        return []
    notes = []
    for model, g in layers.drop_duplicates(["model", "layer"]).groupby("model", sort=False):
        linear = g["layer_type"] == "linear"
        meta = {k: ",".join(map(str, g.loc[m, "layer"])) for k, m in (("linear_layers", linear),
                                                                      ("softmax_layers", ~linear))}  # fmt: skip
        note = linear_note(meta)
        notes += [f"{model}: {note}"] if note else []
    return notes


def report_intro(records: list[dict], settings: dict) -> dict:
    """The page's settings table: the models, their corpus and windows (a sweep's contexts), injection, device."""

    def each(key):  # every distinct value over the models (a Bigram-Backcopy model reads its own chain, not text)
        return ", ".join(dict.fromkeys(str(r["meta"][key]) for r in records if r["meta"].get(key) is not None)) or None

    contexts = settings.get("contexts")
    ctx = ", ".join(map(str, contexts)) if contexts else settings["ctx"] or "model default"
    return {
        "models": ", ".join(dict.fromkeys(r["name"] for r in records)),  # a sweep: several records per model
        "corpus": each("corpus"),
        "corpus fingerprint": each("corpus_fingerprint"),
        "windows": f"{settings['batches']} batches x {settings['batch_size']} windows, ctx "
        f"{ctx}, mode {settings['window_mode']}, "
        f"seed {settings['seed']}",
        "injection": settings["inject"] or "none",
        "device / dtype": f"{settings['device']} / {settings['dtype']}",
        "probe version": settings["probe_version"],
    }


def report_page(tables: dict, records: list[dict], settings: dict, self_contained: bool = False) -> str:
    """`probe report`'s page: the settings, the sink rule and each model's verdict, the tables the run has, the
    figures and the training curves of the reported snapshots."""
    intro = report_intro(records, settings)
    verdicts = _report_verdicts(tables["summary"])
    shown = [
        (
            "Summary (averages over rows t >= 1, heads, layers; *_se: standard error over batches of the per-batch "
            "mean over layers, past the first for r0_later)",
            _readable_summary(tables["summary"], tables.get("batches")),
        )
    ]
    if "sink_eps" in tables:
        cols = [
            "model",
            "epsilon",
            "n_sink_heads",
            "n_heads",
            "sink_share",
            "sink_share_se",
            "key0_mass",
            "key0_mass_se",
            "phantom_share",
        ]
        eps = tables["sink_eps"]
        shown.append(
            ("Sink^eps (Gu et al.; *_se: jackknife standard error over batches)", eps[[c for c in cols if c in eps]])
        )
    if "injection" in tables:
        shown.append(("Injection (loss increase in nats per token; delta_se: s.e. over batches)", _injection(tables)))
    if "exposure" in tables:
        exp = tables["exposure"]
        cols = ["model", "cutoff", "quiet_share", "quiet_share_se", "phantom_share", "phantom_share_se"]
        shown.append(
            (
                "Exposure (share of each row's attention mass on the quiet reads and on the phantom; *_se: "
                "s.e. over batches)",
                exp[[c for c in cols if c in exp]],
            )
        )
    if "massive" in tables:
        mas = tables["massive"]
        cols = [
            "model",
            "massive",
            "n_massive",
            "first_massive_layer",
            "max_magnitude",
            "max_layer",
            "max_position",
            "max_token",
            "max_ratio",
            "massive_pos0_share",
        ]
        shown.append(
            (
                f"Massive activations (Sun et al.: |h| > {mas['abs_threshold'].iloc[0]:g} and > "
                f"{mas['ratio_threshold'].iloc[0]:g}x the median of its site and window; max_*: the largest over "
                "every site and window)",
                mas[[c for c in cols if c in mas]],
            )
        )
    shown += mechanism_sections(tables)
    return page(
        "Attention-sink report",
        report_figures(tables) + training_figures(records),
        verdicts=verdicts,
        caveats=linear_notes(tables.get("layers")),
        tables=shown,
        intro=intro,
        self_contained=self_contained,
    )


def _report_verdicts(summary: pd.DataFrame) -> list[str]:
    """The sink rule, then one line per model: its verdict and the two numbers the rule reads."""
    verdicts = [
        f"rule: a sink has formed when the position-0 share is >= {SINK_FACTOR:g}x the causal-uniform "
        f"reference and r0 < {SINK_R0:g}, averaged over the layers past the first"
    ]
    verdicts += [
        f"{r['model']}: sink_formed {bool(r['sink_formed'])} ({r['pos0_over_uniform']:.3g}x uniform, "
        f"r0 {r['r0_later']:.3g})"
        for _, r in summary.iterrows()
    ]
    return verdicts


def _injection(tables: dict) -> pd.DataFrame:
    """The injection table, with delta's standard error over batches where the per-batch losses were kept."""
    inj = tables["injection"][["model", "junk", "cutoff", "dose", "loss_clean", "loss_corrupted", "delta"]]
    if "injection_batches" in tables:
        pb = tables["injection_batches"].assign(cutoff=lambda d: d["cutoff"].astype(str))
        inj = inj.assign(cutoff=inj["cutoff"].astype(str))
        se = batch_se(pb, ["delta"], by=["model", "junk", "cutoff", "dose"])
        if se is not None:
            inj = inj.merge(se, on=["model", "junk", "cutoff", "dose"], how="left")
    return inj


def training_figures(records: list[dict]) -> list[go.Figure]:
    """The training curves of every `probe train` run whose snapshots were reported (beside their sink trends)."""
    runs = dict.fromkeys(r["name"].rsplit("@", 1)[0] for r in records if "@" in r["name"])
    frames = {run: pd.DataFrame(metrics_records(Path(run).expanduser())) for run in runs}  # empty for hub revisions
    frames = {run: df for run, df in frames.items() if not df.empty}
    return [training_figure(frames)] if frames else []


def report_text(tables: dict, settings: dict, n_models: int, shard: str | None = None) -> str:
    """`probe report`'s terminal text: what was compared, the summary table and the injection table."""
    share = f"{n_models} models"
    if shard:
        share = f"shard {shard.strip()}, {len(tables.get('summary', ()))} of {n_models} models"
    if not tables:  # more shards than models: the folder's manifest is all the merge needs
        return f"sink report: {share}"
    data = settings["data"] or "each model's default data"  # None: wikitext-2-test, a BB model's own chain
    contexts = f", contexts {' '.join(map(str, settings['contexts']))}" if settings.get("contexts") else ""
    text = [
        f"sink report: {share}, {data}, {settings['batches']} x {settings['batch_size']} windows{contexts}",
        show(
            tables["summary"],
            [
                "model",
                "step",
                "ctx",  # a report over several contexts: one row per (model, T)
                "pos0_share",
                "uniform_ref",
                "pos0_over_uniform",
                "phantom_share",
                "r0",
                "r0_later",
                "sink_formed",
            ],
            identity=True,
        ),
    ]
    for note in linear_notes(tables.get("layers")):  # a hybrid model: which layers its statistics leave out
        text += note_lines(note)
    if (mech := mechanism_columns(tables)) is not None:
        last = "; mixing: the sensitivity's, at the last layer" if "sensitivity" in tables else ""
        text += ["", f"sink mechanisms (means over layers{last}):", show(mech, list(mech.columns), identity=True)]
    if "injection" in tables:
        text += [
            "",
            "injection (loss increase, nats per token):",
            show(
                tables["injection"],
                ["model", "step", "ctx", "junk", "cutoff", "dose", "loss_clean", "delta"],
                identity=True,
            ),
        ]
    return glossed(text)
