"""Summaries over seeds that several recipes report."""

from __future__ import annotations

import pandas as pd


def mean_se(df: pd.DataFrame, by: list[str], cols: list[str]) -> pd.DataFrame:
    """Mean and standard error (ddof 1 / sqrt n) of ``cols`` over the rows of each group (NaN se for n = 1)."""
    g = df.groupby(by, sort=False)[cols]
    mean, sd, n = g.mean(), g.std(ddof=1), g.count()
    out = mean.copy()
    for c in cols:
        out[f"{c}_se"] = sd[c] / n[c] ** 0.5
    out["n"] = n[cols[0]]
    return out.reset_index()
