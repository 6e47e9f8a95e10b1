"""`probe inject`: its terminal text, figures, page sections and the descriptions of its files."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from probe.analyses.stats import batch_se
from probe.present.figures import error_bars, many, result_name, se_bars, threshold
from probe.present.files import header, result_meta, show
from probe.present.sections import drop_ids, n_batches, pm, se_caveat

# One line on each file of this analysis an output folder may hold (probe.present.page's index.html shows them)
DESCRIPTIONS = {
    "inject.html": "value-noise injection: loss increase per condition with standard errors, exposure, figures",
    "inject.json": "value-noise injection: every table and the run's settings (JSON)",
    "inject_results.csv": "loss increase per condition (junk x cutoff x dose)",
    "inject_per_batch.csv": "loss increase per condition and evaluation batch",
    "inject_exposure.csv": "share of attention mass on quiet reads and on the phantom",
}


def inject_sections(result: dict) -> dict:
    """Injection: one line per (junk, cutoff) at its largest dose; results with s.e. over batches; exposure."""
    per_batch = result.get("per_batch")
    keys = ["junk", "cutoff", "dose"]
    res = drop_ids(result["results"])
    if per_batch is not None and len(per_batch):
        pb = per_batch.assign(cutoff=per_batch["cutoff"].astype(str))
        res = (
            res.assign(cutoff=res["cutoff"].astype(str))
            .merge(batch_se(pb, ["delta"], keys), on=keys, how="left")
            .merge(pb.groupby(keys, sort=False).size().rename("n_batches").reset_index(), on=keys, how="left")
        )
    verdicts = []
    for (junk, cutoff), g in res.groupby(["junk", "cutoff"], sort=False):
        top = g.sort_values("dose").iloc[-1]
        err = f" ± {top['delta_se']:.2g}" if "delta_se" in top and pd.notna(top["delta_se"]) else ""
        verdicts.append(
            f"{junk} junk on the {cutoff} quiet reads at dose {top['dose']:g}: loss "
            f"{top['delta']:+.4g}{err} nats per token (corrupted - clean; mean ± s.e. over batches)"
        )
    tables = [("Loss increase per condition (nats per token; delta_se: standard error over batches)", res)]
    if "exposure" in result:
        e = result["exposure"]
        for _, row in e.iterrows():
            verdicts.append(
                f"exposure: {row['quiet_share']:.1%}{pm(row, 'quiet_share')} of each row's attention "
                f"mass falls on the {row['cutoff']} quiet reads, {row['phantom_share']:.1%}"
                f"{pm(row, 'phantom_share')} on the phantom (mean ± s.e. over batches)"
            )
        tables.append(
            (
                "Exposure (share of each row's attention mass, phantom included; *_se: standard error over batches)",
                drop_ids(e),
            )
        )
    if "exposure_layers" in result:
        tables.append(("Exposure per layer (± standard error over batches)", drop_ids(result["exposure_layers"])))
    return {"verdicts": verdicts, "caveats": se_caveat(n_batches(result)), "tables": tables}


def injection_figure(results) -> go.Figure:
    """Dose-response: loss increase against dose (± s.e. over batches), one line per (model, junk type, cutoff)."""
    fig = go.Figure()
    doses = sorted({float(d) for res in many(results) for d in res["results"]["dose"]})
    for res in many(results):
        r, per_batch = res["results"], res.get("per_batch")
        se = None
        if per_batch is not None and len(per_batch):
            se = batch_se(
                per_batch.assign(cutoff=per_batch["cutoff"].astype(str)),
                ["delta"],
                ["junk", "cutoff", "dose"],
                indexed=True,
            )["delta_se"]
        for (junk, cutoff), g in r.groupby(["junk", "cutoff"], sort=False):
            g = g.sort_values("dose")
            keys = [(junk, str(cutoff), d) for d in g["dose"]]
            fig.add_trace(
                go.Scatter(
                    x=g["dose"],
                    y=g["delta"],
                    mode="lines+markers",
                    error_y=error_bars(se, keys),
                    name=f"{result_name(res)} · {junk} ({cutoff})",
                )
            )
    threshold(fig, 0, "no change")
    fig.update_layout(
        title="Injected interference (± standard error over batches)",
        xaxis_title="dose ε (× median read norm, log scale)",
        yaxis_title="loss increase (nats per token)",
        xaxis_type="log",
    )
    # ticks at the doses run (a log axis would label 0.2 .. 0.9 as bare digits 2 .. 9)
    fig.update_xaxes(tickmode="array", tickvals=doses, ticktext=[f"{d:g}" for d in doses])
    return fig


def exposure_figure(results) -> go.Figure:
    """Share of attention mass on quiet reads (per cutoff) and on the phantom; models are categories, ± standard error
    over batches where the result has it."""
    fig = go.Figure()
    rows = []
    for res in many(results):
        e = res["exposure"]
        for _, r in e.iterrows():
            rows.append((result_name(res), f"quiet ({r['cutoff']})", r["quiet_share"], r.get("quiet_share_se")))
        rows.append((result_name(res), "phantom", float(e["phantom_share"].iloc[0]), e.iloc[0].get("phantom_share_se")))
    df = pd.DataFrame(rows, columns=["model", "kind", "share", "share_se"])
    for kind, g in df.groupby("kind", sort=False):
        fig.add_trace(
            go.Bar(
                x=g["model"],
                y=g["share"],
                name=kind,
                error_y=se_bars(g, "share") if g["share_se"].notna().any() else None,
            )
        )
    fig.update_layout(
        title="Exposure to injected junk",
        xaxis_title="model",
        yaxis_title="share of attention mass (fraction of each row)",
        barmode="group",
    )
    return fig


TITLE = "Value-noise injection"


def figures(result: dict) -> list:
    return [injection_figure(result)] + ([exposure_figure(result)] if "exposure" in result else [])


def sections(result: dict) -> dict:
    return inject_sections(result)


def text(result: dict) -> str:
    lines = [
        header(result_meta(result)),
        "",
        "loss increase (corrupted - clean, nats per token):",
        show(result["results"], ["junk", "cutoff", "dose", "loss_clean", "loss_corrupted", "delta"]),
    ]
    if "exposure" in result:
        lines += [
            "",
            "exposure (share of each row's attention mass, phantom included):",
            show(result["exposure"], ["cutoff", "quiet_share", "quiet_share_se", "phantom_share", "phantom_share_se"]),
        ]
    return "\n".join(lines)
