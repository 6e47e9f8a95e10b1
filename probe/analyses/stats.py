"""Paired comparisons between variants trained with the same seeds (docs/definitions.md#paired-differences, GatedV, Wang
2026 Table 2), and standard errors over evaluation batches (of per-batch means; the delete-one jackknife for other
statistics).

Inputs are long tables with one row per (variant, seed): columns ``variant``, ``seed`` and a metric (default
``loss``, lower is better). An improvement is ``other - variant`` for lower-is-better metrics (positive = better).
Standard errors are sample standard deviations (ddof 1) over seeds divided by sqrt(n).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd


def _se(x: np.ndarray) -> float:
    x = np.asarray(x, dtype=float)
    x = x[~np.isnan(x)]
    return float(np.std(x, ddof=1) / math.sqrt(len(x))) if len(x) > 1 else float("nan")


def mean_all(frame: pd.DataFrame, by, columns, *, sort: bool = True) -> pd.DataFrame:
    """Per ``by`` group the mean of each column over **every** row: a NaN (a non-finite model's head) makes its group's
    mean NaN instead of being dropped silently (docs/definitions.md#sink-rule); groups sorted, or with ``sort=False`` in
    their order of first appearance, as ``groupby``'s."""
    cols = list(columns)
    return frame.groupby(by, sort=sort)[cols].agg(lambda s: s.mean(skipna=False)).reset_index()


def jackknife_se(leave_one_out) -> np.ndarray | float:
    """Delete-one jackknife standard error from a statistic recomputed with each batch left out in turn:
    leave_one_out (n, ...) holds θ_-i along axis 0; s.e. = sqrt((n-1)/n · Σ_i (θ_-i - mean θ_-·)²) per entry,
    NaN with fewer than two batches. For ratios of sums and thresholded statistics, where a mean of per-batch values
    would be biased; for a plain mean over equal batches it equals the s.e. of the batch means (ddof 1 / sqrt(n))."""
    theta = np.asarray(leave_one_out, dtype=float)
    n = theta.shape[0]
    if n < 2:
        se = np.full(theta.shape[1:], np.nan)
    else:
        se = np.sqrt((n - 1) / n * ((theta - theta.mean(0)) ** 2).sum(0))
    return float(se) if se.ndim == 0 else se


def batch_se(
    batches: pd.DataFrame | None, columns, by: str | list | None = "layer", *, indexed: bool = False
) -> pd.DataFrame | None:
    """Standard error over batches (docs/definitions.md#batch-standard-errors) of each column, as ``<column>_se``:
    per ``by`` group (e.g. per layer; ``indexed``: the groups as the index, else as columns), or of the per-batch
    average over the groups (``by=None``: the summary, one row); None without per-batch data. ``batches`` has one
    row per batch and group (a ``batch`` column)."""
    if batches is None or batches.empty or "batch" not in batches:
        return None
    cols = [c for c in columns if c in batches]
    if by is None:
        per_batch = batches.groupby("batch")[cols].agg(lambda s: s.mean(skipna=False))
        return per_batch.sem(skipna=False).to_frame().T.rename(columns=lambda c: f"{c}_se")
    # every batch counts: a NaN batch value makes the standard error NaN, never one over the other batches
    se = batches.groupby(by)[cols].agg(lambda s: s.sem(skipna=False)).rename(columns=lambda c: f"{c}_se")
    return se if indexed else se.reset_index()


def with_batch_se(table: pd.DataFrame, batches, columns, by: str | list | None = "layer") -> pd.DataFrame:
    """``table`` with a ``<column>_se`` (``batch_se``) beside each column, when per-batch data exist."""
    se = batch_se(batches, columns, by)
    table = table.reset_index(drop=True)
    if se is None:
        return table
    if by is None:
        table = pd.concat([table, se.reset_index(drop=True)], axis=1)
    else:
        table = table.merge(se, on=by, how="left")
    order = [c for col in table.columns if not col.endswith("_se") for c in (col, f"{col}_se") if c in table.columns]
    return table[order]


def _wide(df: pd.DataFrame, value: str) -> pd.DataFrame:
    if df.duplicated(["variant", "seed"]).any():
        raise ValueError("paired statistics need one row per (variant, seed)")
    return df.pivot(index="seed", columns="variant", values=value)


def paired_differences(
    df: pd.DataFrame, baseline: str, variants=None, *, value: str = "loss", lower_is_better: bool = True
) -> dict[str, pd.DataFrame]:
    """Per-seed improvements of each variant over ``baseline`` (only seeds both have), and their summary.

    Returns ``per_seed`` (seed, variant, baseline value, variant value, improvement) and ``summary`` (variant, n,
    mean improvement, se, n_improved)."""
    wide = _wide(df, value)
    if baseline not in wide:
        raise ValueError(f"baseline {baseline!r} not among the variants {sorted(wide.columns)}")
    variants = [v for v in wide.columns if v != baseline] if variants is None else list(variants)
    rows, summary = [], []
    for v in variants:
        if v not in wide:
            raise ValueError(f"variant {v!r} not among {sorted(wide.columns)}")
        pair = wide[[baseline, v]].dropna()
        imp = (pair[baseline] - pair[v]) if lower_is_better else (pair[v] - pair[baseline])
        rows += [
            {
                "seed": s,
                "variant": v,
                "baseline": float(pair.at[s, baseline]),
                "value": float(pair.at[s, v]),
                "improvement": float(imp[s]),
            }
            for s in pair.index
        ]
        summary.append(
            {
                "variant": v,
                "baseline": baseline,
                "n": len(imp),
                "mean": float(imp.mean()),
                "se": _se(imp.to_numpy()),
                "n_improved": int((imp > 0).sum()),
            }
        )
    return {"per_seed": pd.DataFrame(rows), "summary": pd.DataFrame(summary)}


def perplexity_summary(df: pd.DataFrame, *, value: str = "loss") -> pd.DataFrame:
    """Per variant: mean of per-seed perplexities exp(loss) ± their standard deviation (ddof 1), and n seeds."""
    ppl = df.assign(ppl=np.exp(df[value].astype(float)))
    out = ppl.groupby("variant", sort=False)["ppl"].agg(
        ["mean", lambda x: float(np.std(x, ddof=1)) if len(x) > 1 else float("nan"), "count"]
    )
    out.columns = ["ppl_mean", "ppl_sd", "n"]
    return out.reset_index()


def document_bootstrap(diff_sums, doc_ids, n_tokens, *, n_resamples: int = 2000, seed: int = 0) -> dict:
    """Document bootstrap of a token-weighted mean loss difference.

    diff_sums: (n_pairs, n_windows) summed loss differences per window for each seed pair (or (n_windows,));
    doc_ids: (n_windows,) document of each window; n_tokens: (n_windows,) or a scalar. Each document's summed
    difference is averaged over seed pairs; documents are resampled with replacement ``n_resamples`` times with a
    seeded generator, and the statistic Σ_d D_d / Σ_d n_d is recomputed. Returns mean, lo (2.5%), hi (97.5%),
    n_documents, n_pairs, n_resamples, seed."""
    d = np.atleast_2d(np.asarray(diff_sums, dtype=float))
    doc_ids = np.asarray(doc_ids)
    n_tok = np.broadcast_to(np.asarray(n_tokens, dtype=float), doc_ids.shape)
    if d.shape[1] != len(doc_ids):
        raise ValueError(f"{d.shape[1]} windows of differences but {len(doc_ids)} document ids")
    docs, inverse = np.unique(doc_ids, return_inverse=True)
    per_doc = np.zeros(len(docs))
    np.add.at(per_doc, inverse, d.mean(0))  # summed difference per document, averaged over seed pairs
    tok_doc = np.zeros(len(docs))
    np.add.at(tok_doc, inverse, n_tok)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(docs), size=(n_resamples, len(docs)))
    stats = per_doc[idx].sum(1) / tok_doc[idx].sum(1)
    lo, hi = np.percentile(stats, [2.5, 97.5])
    return {
        "mean": float(per_doc.sum() / tok_doc.sum()),
        "lo": float(lo),
        "hi": float(hi),
        "n_documents": len(docs),
        "n_pairs": d.shape[0],
        "n_resamples": n_resamples,
        "seed": seed,
    }


def abstention_decomposition(
    df: pd.DataFrame,
    *,
    baseline: str = "baseline",
    sink: str = "sinklogit",
    gate: str = "normgate",
    both: str = "sink+norm",
    value: str = "loss",
) -> pd.DataFrame:
    """Table 2: improvements over the baseline from the sink alone, the gate alone and both, paired per seed;
    overlap = sink + gate - both, filter = both - sink, share = filter / both (of the means). Rows: the quantities,
    columns mean, se, n. A missing gate variant leaves gate and overlap NaN."""
    wide = _wide(df, value)
    for v in (baseline, sink, both):
        if v not in wide:
            raise ValueError(f"variant {v!r} not among {sorted(wide.columns)}")
    imp = {k: wide[baseline] - wide[v] for k, v in (("sink", sink), ("both", both))}
    imp["gate"] = wide[baseline] - wide[gate] if gate in wide else pd.Series(np.nan, index=wide.index)
    imp["overlap"] = imp["sink"] + imp["gate"] - imp["both"]
    imp["filter"] = imp["both"] - imp["sink"]  # = sink+gate variant vs sink alone, per seed
    rows = []
    for k in ("sink", "gate", "both", "overlap", "filter"):
        x = imp[k].dropna()
        rows.append(
            {"quantity": k, "mean": float(x.mean()) if len(x) else float("nan"), "se": _se(x.to_numpy()), "n": len(x)}
        )
    both_mean, filt = rows[2]["mean"], rows[4]["mean"]
    rows.append(
        {
            "quantity": "share",
            "mean": filt / both_mean if both_mean else float("nan"),
            "se": float("nan"),
            "n": rows[4]["n"],
        }
    )
    return pd.DataFrame(rows)


__all__ = [
    "paired_differences",
    "perplexity_summary",
    "document_bootstrap",
    "abstention_decomposition",
    "jackknife_se",
    "batch_se",
    "mean_all",
    "with_batch_se",
]
