"""Value-noise injection on pretrained models (Wang 2026 Table 13, App. "Injection in pretrained models").

For every model in ``models`` (any name ``probe.load`` takes), on its own BOS-aware evaluation windows
(``probe.experiments.pretrained``): ``probe.analyses.inject.inject`` with junk transplanted from another context of
the batch (``structured``), from the same sequence (``same-context``) and Gaussian noise, on the quietest quarter
(``q25``) and half (``median``) of each head's reads, at doses ε of the head's median read norm. Tables:

    table13    one row per model x cutoff x junk, one column per dose: the loss increase Δ (nats) over the clean model
    ratio      one row per model x cutoff: structured Δ / Gaussian Δ per dose
    injection  long form (model, junk, cutoff, dose, loss_clean, loss_corrupted, delta)
    exposure   per model and cutoff: the share of each row's mass on the quiet reads, and on the phantom (clean pass)
    models     per model: windows (corpus, ctx, BOS), layer types, seconds
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from probe.analyses.inject import conditions, dose_warning, inject
from probe.console import note
from probe.experiments.pretrained import check_spec, each_model, window_meta
from probe.experiments.result import Result, Timer, config_dict
from probe.jobs.specs import EvaluationOptions
from probe.present.figures import log_axis

RECIPE = "pretrained-injection"
JUNK = ("structured", "same-context", "gaussian")
COLOURS = {
    "structured": "#d62728",
    "same-context": "#ff7f0e",
    "gaussian": "#1f77b4",
    "random-direction": "#2ca02c",
    "own-direction": "#9467bd",
}


@dataclass
class PretrainedInjectionConfig(EvaluationOptions):
    batch_size: int = 8  # structured junk needs at least 2 (its pool is the other sequences of the batch)
    junk: tuple = JUNK
    cutoffs: tuple = ("q25", "median")
    doses: tuple = (0.1, 0.2, 0.4, 0.8, 1.6)
    exposure: bool = True  # also measure the mass on the quiet reads and the phantom (clean pass)


CONFIG = PretrainedInjectionConfig


def dose_column(dose: float) -> str:
    return f"eps={dose:g}"


def wide_table(long: pd.DataFrame) -> pd.DataFrame:
    """Table 13: rows model x cutoff x junk in the order run, the clean loss, then Δ per dose."""
    t = long.pivot_table(index=["model", "cutoff", "junk"], columns="dose", values="delta", sort=False, dropna=False)
    t = t[sorted(t.columns)]
    t.columns = [dose_column(d) for d in t.columns]
    clean = long.groupby(["model", "cutoff", "junk"], sort=False)["loss_clean"].first()
    return t.join(clean).reset_index()[["model", "cutoff", "junk", "loss_clean", *t.columns]]


def ratio_table(wide: pd.DataFrame, over: str = "structured", under: str = "gaussian") -> pd.DataFrame:
    """structured Δ / Gaussian Δ per dose, one row per model x cutoff (empty without both junk types)."""
    doses = [c for c in wide.columns if c.startswith("eps=")]
    top = wide[wide["junk"] == over].set_index(["model", "cutoff"])[doses]
    bottom = wide[wide["junk"] == under].set_index(["model", "cutoff"])[doses]
    if top.empty or bottom.empty:
        return pd.DataFrame(columns=["model", "cutoff", "ratio", *doses])
    ratio = (top / bottom).reset_index()
    ratio.insert(2, "ratio", f"{over} / {under}")
    return ratio


def figure(long: pd.DataFrame):
    """Δ against dose (log x), one line per junk type, one panel per model (rows) and cutoff (columns)."""
    models, cutoffs = list(dict.fromkeys(long["model"])), list(dict.fromkeys(long["cutoff"]))
    fig = make_subplots(
        rows=len(models),
        cols=len(cutoffs),
        shared_xaxes=True,
        vertical_spacing=0.08,
        subplot_titles=[f"{m} · cutoff {c}" for m in models for c in cutoffs],
    )
    for i, model in enumerate(models, start=1):
        for j, cutoff in enumerate(cutoffs, start=1):
            cell = long[(long["model"] == model) & (long["cutoff"] == cutoff)]
            for junk, g in cell.groupby("junk", sort=False):
                fig.add_trace(
                    go.Scatter(
                        x=g["dose"],
                        y=g["delta"],
                        mode="lines+markers",
                        name=junk,
                        legendgroup=junk,
                        showlegend=i == 1 and j == 1,
                        line=dict(color=COLOURS.get(junk)),
                        hovertemplate=f"{junk}: ε=%{{x}}, Δ=%{{y:.4g}}",
                    ),
                    row=i,
                    col=j,
                )
            log_axis(fig, "x", row=i, col=j)
            fig.update_yaxes(title_text="Δ loss (nats)" if j == 1 else None, row=i, col=j)
    for j in range(1, len(cutoffs) + 1):
        fig.update_xaxes(title_text="dose ε (× median read norm)", row=len(models), col=j)
    fig.update_layout(title="Value-noise injection: loss increase against dose", height=max(400, 320 * len(models)))
    return fig


def run(cfg: PretrainedInjectionConfig | None = None, *, progress: bool = False, out=None) -> Result:
    """Table 13 for every model of ``cfg.models``; with ``out``, finished models are stored there and reused."""
    cfg = cfg or PretrainedInjectionConfig()
    conditions(cfg.junk, cfg.cutoffs, cfg.doses)  # unknown junk types or cutoffs: fail before loading anything
    if (warning := dose_warning(cfg.doses)) is not None:  # it runs, as asked
        note(f"pretrained-injection: warning: {warning}")
    if "structured" in cfg.junk and cfg.batch_size < 2:
        raise ValueError(
            "--junk structured needs --batch-size >= 2 (its junk comes from the other sequences of the batch)"
        )
    names = check_spec(cfg)
    timer = Timer()

    def compute(name, model, windows):
        t0 = time.perf_counter()
        res = inject(
            model,
            windows,
            junk=list(cfg.junk),
            cutoffs=list(cfg.cutoffs),
            doses=list(cfg.doses),
            seed=cfg.seed,
            exposure=cfg.exposure,
            progress=progress,
        )
        tables = {"injection": res["results"].drop(columns=["model", "corpus"]).assign(model=name)}
        if cfg.exposure:
            tables["exposure"] = res["exposure"].drop(columns=["model", "corpus"]).assign(model=name)
        meta = {
            **window_meta(windows, model),
            "n_tokens": int(res["meta"]["n_tokens"].iloc[0]),
            "seconds": round(time.perf_counter() - t0, 2),
        }
        return {k: df[["model"] + [c for c in df.columns if c != "model"]] for k, df in tables.items()}, meta

    done = each_model(RECIPE, names, cfg, out, compute, progress)
    long = pd.concat([t["injection"] for _, t, _ in done], ignore_index=True)
    wide = wide_table(long)
    tables = {"table13": wide, "ratio": ratio_table(wide), "injection": long}
    if cfg.exposure:
        tables["exposure"] = pd.concat([t["exposure"] for _, t, _ in done], ignore_index=True)
    tables["models"] = pd.DataFrame([{"model": name, **meta} for name, _, meta in done])
    return Result(
        RECIPE,
        config_dict(cfg),
        tables,
        {"delta_vs_dose": figure(long)},
        timer.meta(models=len(names)),
        headline=tuple(k for k in ("table13", "ratio", "exposure", "models") if k in tables),
    )


__all__ = ["PretrainedInjectionConfig", "wide_table", "ratio_table", "figure", "run"]
