"""What each analysis page opens with: verdict lines (with the rule that decided them), the summary table, per-layer
tables with standard errors over evaluation batches (or windows), a note where a table is empty, and caveats where
the sample is too small for a statistic. Each function takes an analysis result (dict of DataFrames) and returns the
keyword arguments of ``probe.present.page.page``: ``verdicts``, ``caveats``, ``tables``.

Standard errors: sample standard deviation (ddof 1) of the per-batch means over batches, divided by sqrt(batches);
batches are equal-sized, so their mean is the pooled mean. Ratios of sums and thresholded statistics (token-identity
share, Sink^eps) carry delete-one-batch jackknife standard errors computed by their analyses (``*_se`` columns)."""
from __future__ import annotations

import pandas as pd

from probe.analyses.sinks import SINK_FACTOR, SINK_R0
from probe.analyses.stats import batch_se, with_batch_se

ID_COLUMNS = ["model", "corpus"]
MIN_BATCHES = 2  # a standard error needs at least two batches
MAX_CHANCE_SHARE = 0.05  # token-identity share a token-blind gate reaches by chance, above which we warn


def _drop_ids(df: pd.DataFrame) -> pd.DataFrame:
    return df.drop(columns=[c for c in ID_COLUMNS if c in df.columns])


def _with_se(table: pd.DataFrame, batches, columns, by="layer") -> pd.DataFrame:
    """``table`` without its id columns, with a ``<column>_se`` beside each column (when per-batch data exist)."""
    return with_batch_se(_drop_ids(table), batches, columns, by)


def _n_batches(result) -> int:
    b = result.get("batches", result.get("per_batch"))
    return int(b["batch"].nunique()) if b is not None and "batch" in b else 0


def _se_caveat(n: int, what: str = "evaluation batches") -> list[str]:
    if n >= MIN_BATCHES:
        return []
    return [f"standard errors need at least {MIN_BATCHES} {what} (this run: {n}); run with more --batches"]


def _pm(row, col: str, fmt: str = ".1%") -> str:
    """' ± s.e.' of ``col`` from its ``<col>_se`` column, or nothing (no column, or NaN: fewer than two batches)."""
    se = row.get(f"{col}_se")
    return f" ± {se:{fmt}}" if se is not None and pd.notna(se) else ""


def _later(layers: pd.DataFrame) -> pd.DataFrame:
    return layers[layers["layer"] > 0] if len(layers) > 1 else layers


def sink_sections(result: dict) -> dict:
    """Sinks: the sink_formed verdict with its rule, Sink^eps lines; summary, per-layer (± s.e.), Sink^eps tables."""
    s = result["summary"].iloc[0]
    batches = result.get("batches")
    later = _later(result["layers"])
    verdicts = [f"sink_formed: {bool(s['sink_formed'])} — rule: position-0 share >= {SINK_FACTOR:g}x the "
                f"causal-uniform reference and r0 < {SINK_R0:g}, averaged over the layers past the first "
                f"(here {s['pos0_over_uniform']:.3g}x and r0 = {s['r0_later']:.3g})"]
    if "sink_eps_summary" in result:
        key0 = result["sink_eps_summary"]["key0"].iloc[0] if "key0" in result["sink_eps_summary"] else "key 0"
        for _, e in result["sink_eps_summary"].iterrows():
            verdicts.append(f"Sink^{e['epsilon']:g}: {int(e['n_sink_heads'])} of {int(e['n_heads'])} heads "
                            f"({e['sink_share']:.1%}{_pm(e, 'sink_share')}) put more than {e['epsilon']:g} of their "
                            f"mean attention on {key0}")
    later_b = batches[batches["layer"].isin(later["layer"])] if batches is not None and len(batches) else None
    se = batch_se(later_b, ["pos0_share", "uniform_ref", "r0"], by=None)
    summary = _drop_ids(result["summary"])
    if se is not None:
        summary = summary.assign(pos0_share_later_se=se["pos0_share_se"].iloc[0], r0_later_se=se["r0_se"].iloc[0])
    tables = [("Summary (rows t >= 1, averaged over heads and layers; *_later_se: s.e. over batches of the "
               "layers past the first)", summary)]
    if len(result.get("by_type", ())) > 1:
        tables.append(("By layer type", _drop_ids(result["by_type"])))
    tables.append(("Per layer (± standard error over batches)",
                   _with_se(result["layers"], batches, ["pos0_share", "phantom_share", "r0"])))
    if "sink_eps_summary" in result:
        tables.append(("Sink^eps (Gu et al.): heads whose mean attention on key 0 exceeds eps (*_se: jackknife "
                       "standard error over batches)", _drop_ids(result["sink_eps_summary"])))
    if "sink_eps_layers" in result:
        tables.append(("Sink^eps per layer (± jackknife standard error over batches)",
                       _drop_ids(result["sink_eps_layers"])))
    if "massive_layers" in result:
        tables.append(("Massive activations (Sun et al.; |h| > 100 and > 1000x the median)",
                       _drop_ids(result["massive_layers"]),
                       "no layer has a massive activation in these windows"))
    if "dormant_summary" in result:
        tables.append(("Active / dormant heads per input domain (Guo et al.)", _drop_ids(result["dormant_summary"])))
        tables.append(("Heads that switch between active and dormant across domains",
                       _drop_ids(result["dormant_switching"]), "no head switches between the domains"))
    return {"verdicts": verdicts, "caveats": _se_caveat(_n_batches(result)), "tables": tables}


def inject_sections(result: dict) -> dict:
    """Injection: one line per (junk, cutoff) at its largest dose; results with s.e. over batches; exposure."""
    per_batch = result.get("per_batch")
    keys = ["junk", "cutoff", "dose"]
    res = _drop_ids(result["results"])
    if per_batch is not None and len(per_batch):
        pb = per_batch.assign(cutoff=per_batch["cutoff"].astype(str))
        res = res.assign(cutoff=res["cutoff"].astype(str)).merge(
            batch_se(pb, ["delta"], keys), on=keys, how="left").merge(
            pb.groupby(keys, sort=False).size().rename("n_batches").reset_index(), on=keys, how="left")
    verdicts = []
    for (junk, cutoff), g in res.groupby(["junk", "cutoff"], sort=False):
        top = g.sort_values("dose").iloc[-1]
        err = f" ± {top['delta_se']:.2g}" if "delta_se" in top and pd.notna(top["delta_se"]) else ""
        verdicts.append(f"{junk} junk on the {cutoff} quiet reads at dose {top['dose']:g}: loss "
                        f"{top['delta']:+.4g}{err} nats per token (corrupted - clean; mean ± s.e. over batches)")
    tables = [("Loss increase per condition (nats per token; delta_se: standard error over batches)", res)]
    if "exposure" in result:
        e = result["exposure"]
        for _, row in e.iterrows():
            verdicts.append(f"exposure: {row['quiet_share']:.1%}{_pm(row, 'quiet_share')} of each row's attention "
                            f"mass falls on the {row['cutoff']} quiet reads, {row['phantom_share']:.1%}"
                            f"{_pm(row, 'phantom_share')} on the phantom (mean ± s.e. over batches)")
        tables.append(("Exposure (share of each row's attention mass, phantom included; *_se: standard error over "
                       "batches)", _drop_ids(e)))
    if "exposure_layers" in result:
        tables.append(("Exposure per layer (± standard error over batches)", _drop_ids(result["exposure_layers"])))
    return {"verdicts": verdicts, "caveats": _se_caveat(_n_batches(result)), "tables": tables}


def gate_sections(result: dict, k: int = 10) -> dict:
    """Gates: mean gate, selectivity and token-identity lines; summary, per layer (± s.e.), token tables."""
    s = result["summary"].iloc[0]
    tokens, min_count = result["tokens"], int(s.get("min_count", 0))
    verdicts = [f"mean gate {s['mean_gate']:.3g} (attention-weighted), selectivity {s['selectivity']:.3g}, "
                f"{s['frac_below_half']:.1%} of reads gated below 0.5",
                f"token identity explains {s['token_share']:.1%}{_pm(s, 'token_share')} of the gate variance "
                f"({s['token_share_min_count']:.1%}{_pm(s, 'token_share_min_count')} over tokens seen >= {min_count} "
                "times; ± jackknife s.e. over batches)"]
    caveats = _se_caveat(_n_batches(result))
    for label, n, u in (("all tokens", s.get("n_token_reads"), s.get("n_token_types")),
                        (f"tokens seen >= {min_count} times", s.get("n_frequent_reads"), s.get("n_frequent_types"))):
        chance = (u - 1) / (n - 1) if n and u and n > 1 else None  # between/total share of a gate blind to tokens
        if chance is not None and chance > MAX_CHANCE_SHARE:
            caveats.append(f"token-identity share over {label} rests on {int(n)} reads of {int(u)} distinct tokens: "
                           f"a gate unrelated to token identity would already score about {chance:.0%} "
                           "((types - 1) / (reads - 1)); too small a sample, use more --batches")
    empty = f"no token occurs {min_count} times in these windows (lower --min-count or use more --batches)"
    tables = [("Summary (rows t >= 1, averaged over heads and layers; token_share*_se: jackknife standard error over "
               "batches)", _drop_ids(result["summary"])),
              ("Per layer (± standard error over batches)",
               _with_se(result["layers"], result.get("batches"), ["mean_gate", "selectivity", "read_mean_gate"])),
              (f"Most attenuated tokens (count >= {min_count})", _drop_ids(tokens.head(k)), empty),
              (f"Least attenuated tokens (count >= {min_count})", _drop_ids(tokens.tail(k).iloc[::-1]), empty)]
    return {"verdicts": verdicts, "caveats": caveats, "tables": tables}


def source_sections(result: dict) -> dict:
    """Depth routing: effective sources line; summary and per-site tables."""
    s = result["summary"].iloc[0]
    verdicts = [f"effective sources N_eff = {s['neff_mean']:.3g} on average over {int(s['n_sites'])} read sites "
                f"(top-1 mass {s['top1_mass']:.3g}, input dependence {s['input_dependence']:.3g} nats)"]
    return {"verdicts": verdicts, "tables": [("Summary", _drop_ids(result["summary"])),
                                             ("Per read site (± std over tokens)", _drop_ids(result["sites"]))]}


def eval_sections(result: dict) -> dict:
    """Evaluation: loss ± s.e. over windows; summary and per-window tables."""
    s, w = result["summary"].iloc[0], result["windows"]
    se = float(w["loss"].sem()) if len(w) > 1 else float("nan")
    verdicts = [f"loss {s['loss']:.4g} ± {se:.2g} nats per token (mean ± s.e. over {len(w)} windows), "
                f"perplexity {s['perplexity']:.4g}"]
    summary = _drop_ids(result["summary"]).assign(loss_se=se)
    return {"verdicts": verdicts, "caveats": _se_caveat(len(w), "windows"),
            "tables": [("Summary", summary), ("Per window", _drop_ids(w))]}


__all__ = ["batch_se", "sink_sections", "inject_sections", "gate_sections", "source_sections", "eval_sections"]
