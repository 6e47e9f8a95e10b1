"""The HTML page of ``probe report --ctx T1 T2 ...``: each model's attention sinks against context length
(docs/definitions.md#context-sweep), with the figure, verdict lines and tables of `probe sinks --ctx`
(``probe.present.sinks_ctx``) per model, then the tables of every model and context."""

from __future__ import annotations

import pandas as pd

from probe.present.page import page
from probe.present.report import report_intro, training_figures
from probe.present.sinks_ctx import sections, sweep_figure

CTX_COLUMNS = ["model", "step", "model_id", "ctx"]  # the identity of a (model, T) row, in the report's tables


def per_model(tables: dict) -> dict[str, dict[str, pd.DataFrame]]:
    """Each model's context sweep as `probe sinks --ctx` shapes it ({"summary", "by_type", "layers"}), report order."""
    out: dict[str, dict[str, pd.DataFrame]] = {}
    for key in ("summary", "by_type", "layers"):
        for model, g in tables[f"ctx_{key}"].groupby("model", sort=False):
            out.setdefault(model, {})[key] = g.reset_index(drop=True)
    return out


def _readable(df: pd.DataFrame) -> pd.DataFrame:
    """A table as people read it: no corpus column (the intro names it), no empty step or model_id columns."""
    df = df.drop(columns=[c for c in ("corpus",) if c in df])
    if "model_id" in df and (df["model_id"].astype(str) == df["model"].astype(str)).all():
        df = df.drop(columns="model_id")
    return df.loc[:, [c for c in df.columns if df[c].notna().any()]]


def report_ctx_page(tables: dict, records: list[dict], settings: dict, self_contained: bool = False) -> str:
    """Verdicts per model (T smallest → largest), one figure per model of each statistic against log T per layer
    type with the causal-uniform reference beside the position-0 share (and the training curves of reported `probe
    train` snapshots), then the tables."""

    models = per_model(tables)
    verdicts, figures = [], []
    for model, result in models.items():
        verdicts += [f"{model}: {line}" for line in sections(result)["verdicts"]]
        fig = sweep_figure(result)
        fig.update_layout(title=f"{model}: attention sinks against context length, per layer type")
        figures.append(fig)
    shown = [
        ("Per model and context length (rows t >= 1, averaged over heads and layers)", tables["ctx_summary"]),
        ("Per model, context length and layer type (means over the layers of the type)", tables["ctx_by_type"]),
        ("Per model, context length and layer", tables["ctx_layers"]),
    ]
    if "injection" in tables:
        cols = [*CTX_COLUMNS, "junk", "cutoff", "dose", "loss_clean", "loss_corrupted", "delta"]
        shown.append(("Injection (loss increase in nats per token)", tables["injection"][cols]))
    if "exposure" in tables:
        cols = [*CTX_COLUMNS, "cutoff", "quiet_share", "phantom_share"]
        shown.append(("Exposure (share of each row's attention mass on the quiet reads)", tables["exposure"][cols]))
    return page(
        "Attention-sink report against context length",
        figures + training_figures(records),  # checkpoints of `probe train` runs: their curves beside the sweep
        verdicts=verdicts,
        tables=[(caption, _readable(df)) for caption, df in shown],
        intro=report_intro(records, settings),
        self_contained=self_contained,
    )


__all__ = ["report_ctx_page", "per_model"]
