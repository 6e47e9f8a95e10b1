"""What each analysis page holds besides its figures: verdict lines (with the rule that decided them), the summary
table, per-layer tables with standard errors over evaluation batches (or windows), a note where a table is empty, and
caveats where the sample is too small for a statistic. Each analysis's ``sections(result)`` (in its module,
``probe.present.<analysis>``) returns the keyword arguments of ``probe.present.page.page``: ``verdicts``,
``caveats``, ``tables``; the helpers they share are here. The skeleton places them: verdicts and caveats first, then
the figures, then the tables (long ones folded).

Standard errors: sample standard deviation (ddof 1) of the per-batch means over batches, divided by sqrt(batches);
batches are equal-sized, so their mean is the pooled mean. Ratios of sums and thresholded statistics (token-identity
share, Sink^eps) carry delete-one-batch jackknife standard errors computed by their analyses (``*_se`` columns)."""

from __future__ import annotations

import pandas as pd

from probe.analyses.stats import with_batch_se

ID_COLUMNS = ["model", "corpus"]
MIN_BATCHES = 2  # a standard error needs at least two batches


def drop_ids(df: pd.DataFrame) -> pd.DataFrame:
    return df.drop(columns=[c for c in ID_COLUMNS if c in df.columns])


def with_se(table: pd.DataFrame, batches, columns, by="layer") -> pd.DataFrame:
    """``table`` without its id columns, with a ``<column>_se`` beside each column (when per-batch data exist)."""
    return with_batch_se(drop_ids(table), batches, columns, by)


def n_batches(result) -> int:
    b = result.get("batches", result.get("per_batch"))
    return int(b["batch"].nunique()) if b is not None and "batch" in b else 0


def se_caveat(n: int, what: str = "evaluation batches") -> list[str]:
    if n >= MIN_BATCHES:
        return []
    return [f"standard errors need at least {MIN_BATCHES} {what} (this run: {n}); run with more --batches"]


def pm(row, col: str, fmt: str = ".1%") -> str:
    """' ± s.e.' of ``col`` from its ``<col>_se`` column, or nothing (no column, or NaN: fewer than two batches)."""
    se = row.get(f"{col}_se")
    return f" ± {se:{fmt}}" if se is not None and pd.notna(se) else ""


def _layers(text) -> list[str]:
    return [l for l in str(text or "").split(",") if l]


def linear_note(meta: dict, what: str = "attention statistics", covered: str = "softmax") -> str | None:
    """The sentence a hybrid model's text and page carry (``meta``'s ``linear_layers`` and ``softmax_layers``, from
    probe.analyses.layer_types.layer_meta): which layers are linear, that ``what`` does not apply to them and which
    layers the means over layers cover; None for a model without linear layers."""
    linear, softmax = _layers(meta.get("linear_layers")), _layers(meta.get("softmax_layers"))
    if not linear:
        return None
    one = len(linear) == 1
    them = f"layer {linear[0]} is linear" if one else f"layers {', '.join(linear)} are linear"
    over = f"the {covered} layer {softmax[0]}" if len(softmax) == 1 else f"the {covered} layers {', '.join(softmax)}"
    return (
        f"{them} (linear attention, convolution or state space: no softmax attention), so {what} do not apply to "
        f"{'it' if one else 'them'} (NaN, shown as -); means over layers are over {over} only"
    )


__all__ = ["ID_COLUMNS", "MIN_BATCHES", "drop_ids", "with_se", "n_batches", "se_caveat", "pm", "linear_note"]
