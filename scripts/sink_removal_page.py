"""The tables and the figure of docs/results/sink-removal.md, from a finished ``probe experiment sink-removal`` folder.

    python scripts/sink_removal_page.py OUT --md docs/results/sink-removal.md --png docs/results/sink-removal.png
    python scripts/sink_removal_page.py RULES_OUT --section rules --md docs/results/sink-removal.md \
        --png docs/results/sink-removal-rules.png

Writes the measured table (per variant: mean over seeds and the paired difference from the baseline ± s.e.) and the
claims table (each paper's claim, what the recipe measured, and whether they agree, by the rule printed beside it)
between the page's markers for ``--section`` (``gates``: the abstention and gating grid; ``rules``: the attention-rule
grid, ``--variants rules``, which also gets a table of each run's training cost; ``diff``: differential attention
beside its own baseline runs, with their cost), and the recipe's figure as a PNG
(drawn by headless Chromium). Every number comes from OUT/summary.csv and OUT/runs.csv; nothing is typed by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import tempfile
from functools import partial
from pathlib import Path

import pandas as pd

from probe.experiments.sink_removal import MECHANISMS, removal_figure
from probe.writes import atomic_write

START, END = (
    "<!-- sink-removal tables: written by scripts/sink_removal_page.py -->",
    "<!-- end of sink-removal tables -->",
)
# each section of the page: its (start, end) markers
SECTIONS = {
    "gates": (START, END),
    "rules": (
        "<!-- sink-removal rules tables: written by scripts/sink_removal_page.py --section rules -->",
        "<!-- end of sink-removal rules tables -->",
    ),
    "diff": (  # differential attention, run after the rules' grid beside its own baseline runs
        "<!-- sink-removal diff tables: written by scripts/sink_removal_page.py --section diff -->",
        "<!-- end of sink-removal diff tables -->",
    ),
}
COLUMNS = (  # metric, header, format
    ("pos0_over_uniform", "pos0 ÷ uniform", "{:.2f}"),
    ("r0_later", "r0", "{:.2f}"),
    ("phantom_share", "phantom", "{:.3f}"),
    ("sink_eps_share", "Sink^0.3", "{:.2f}"),
    ("max_activation", "max \\|h\\|", "{:.1f}"),
    ("mean_gate", "gate mean", "{:.2f}"),
    ("selectivity", "selectivity", "{:.3f}"),
    ("loss", "BB loss", "{:.4f}"),
)


def cell(summary: pd.DataFrame, variant: str, metric: str, fmt: str) -> str:
    r = summary.loc[(variant, metric)]
    if pd.isna(r["mean"]):
        return "–"
    text = fmt.format(r["mean"])
    if r["n_pairs"] > 1:
        text += f" ({_signed(fmt, r['diff'])} ± {fmt.format(r['diff_se'])})"
    elif r["n_pairs"] == 1:  # one pair: a difference without a standard error
        text += f" ({_signed(fmt, r['diff'])})"
    return text


def _signed(fmt: str, x: float) -> str:
    return ("+" if x >= 0 else "−") + fmt.format(abs(x))


def measured_table(summary: pd.DataFrame, variants) -> str:
    head = "| variant | mechanism | " + " | ".join(h for _, h, _ in COLUMNS) + " |"
    lines = [head, "|" + "---|" * (len(COLUMNS) + 2)]
    for v in variants:
        cells = [cell(summary, v, m, f) for m, _, f in COLUMNS]
        lines.append(f"| `{v}` | {MECHANISMS[v][0]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def per_seed(runs: pd.DataFrame, variant: str, metric: str) -> pd.Series:
    return runs[runs["variant"] == variant].set_index("seed")[metric]


def diffs(runs: pd.DataFrame, variant: str, metric: str) -> pd.Series:
    """Per seed, variant − baseline."""
    return (per_seed(runs, variant, metric) - per_seed(runs, "baseline", metric)).dropna()


def run_mean(runs: pd.DataFrame, variant: str, metric: str) -> float:
    return float(per_seed(runs, variant, metric).mean())


def pairs_text(runs: pd.DataFrame, variant: str, metric: str, fmt: str = "{:+.2f}") -> str:
    """The per-seed differences variant − baseline, in seed order."""
    return ", ".join(fmt.format(x) for x in diffs(runs, variant, metric))


def seeds_text(runs: pd.DataFrame, variant: str, metric: str = "pos0_over_uniform") -> str:
    """The per-seed values a threshold rule is applied to, in seed order."""
    return ", ".join(f"{x:.2f}" for x in per_seed(runs, variant, metric))


def every_seed(runs: pd.DataFrame, variant: str, test, metric: str = "pos0_over_uniform") -> bool:
    return bool(test(per_seed(runs, variant, metric)).all())


REMOVES_RULE = "lower pos0 ÷ uniform than the baseline in every seed pair and below the sink rule's 3× in every seed"
STAYS_RULE = "pos0 ÷ uniform still ≥ 3× (the sink rule's mass threshold) in every seed"


def removes_sink(runs: pd.DataFrame, variant: str) -> bool:
    """REMOVES_RULE: below the baseline in every pair and under the sink rule's 3× in every seed."""
    below = bool((diffs(runs, variant, "pos0_over_uniform") < 0).all())
    return below and every_seed(runs, variant, lambda x: x < 3)


def sink_measured(runs: pd.DataFrame, variant: str) -> str:
    """What REMOVES_RULE and STAYS_RULE read: the mean, the per-seed values and the per-pair differences."""
    return (
        f"pos0 ÷ uniform {run_mean(runs, variant, 'pos0_over_uniform'):.2f} vs baseline "
        f"{run_mean(runs, 'baseline', 'pos0_over_uniform'):.2f} (per seed {seeds_text(runs, variant)}; per pair "
        f"{pairs_text(runs, variant, 'pos0_over_uniform')})"
    )


def massive_claim(runs: pd.DataFrame, paper: str, claim: str, variant: str) -> tuple[str, str, str, str, bool | None]:
    """ "``variant`` removes massive activations": testable only where the baseline has one in every seed."""
    mean = partial(run_mean, runs)
    testable = bool(per_seed(runs, "baseline", "massive").astype(bool).all())
    return (
        paper,
        claim,
        "a smaller largest activation than the baseline in every seed pair, where the baseline has a massive "
        "activation (|h| > 100 and > 1000 × its site's median)",
        f"largest activation {mean(variant, 'max_activation'):.1f} vs baseline {mean('baseline', 'max_activation'):.1f}"
        f" (per pair {pairs_text(runs, variant, 'max_activation', '{:+.1f}')}); top-1 ÷ median "
        f"{mean(variant, 'max_ratio'):.1f} vs baseline {mean('baseline', 'max_ratio'):.1f}"
        + ("" if testable else "; the baseline has no massive activation here: the claim is not tested"),
        bool((diffs(runs, variant, "max_activation") < 0).all()) if testable else None,
    )


def claims(runs: pd.DataFrame) -> list[tuple[str, str, str, str, bool]]:
    """(paper, claim, rule, measured, agrees) for each variant the runs have: the gates' and the attention rules'."""
    return gate_claims(runs) + rule_claims(runs)


def gate_claims(runs: pd.DataFrame) -> list[tuple[str, str, str, str, bool]]:
    """The abstention and gating papers' claims."""
    have = set(runs["variant"])
    mean = partial(run_mean, runs)
    fmt_d = partial(pairs_text, runs)
    seeds = partial(seeds_text, runs)
    out = []

    for v in ("outgate", "outgate-head"):
        if v in have:
            form = "element-wise" if v == "outgate" else "headwise"
            out.append(
                (
                    "Qiu et al. 2025",
                    f"G1 ({form}) removes the first-token sink (their first-token attention share falls from about "
                    "47 % to about 5 %)",
                    REMOVES_RULE,
                    sink_measured(runs, v),
                    removes_sink(runs, v),
                )
            )
            out.append(massive_claim(runs, "Qiu et al. 2025", f"G1 ({form}) removes massive activations", v))
            out.append(
                (
                    "Qiu et al. 2025",
                    f"G1's gate scores are sparse ({'element-wise' if v == 'outgate' else 'headwise'}; most gates "
                    "well below ½)",
                    "mean gate below 0.5",
                    f"mean gate {mean(v, 'mean_gate'):.3f}, selectivity {mean(v, 'selectivity'):.3f}",
                    mean(v, "mean_gate") < 0.5,
                )
            )
    if "g2" in have:
        d = diffs(runs, "g2", "pos0_over_uniform")
        out.append(
            (
                "Qiu et al. 2025 (their account)",
                "the sink goes with query-dependent gating; G2, gated at the key, is not query-dependent and should "
                "not remove it",
                "pos0 ÷ uniform still ≥ 3× (the sink rule's mass threshold) in every seed",
                f"pos0 ÷ uniform {mean('g2', 'pos0_over_uniform'):.2f} (per seed {seeds('g2')}; per pair "
                f"{fmt_d('g2', 'pos0_over_uniform')})",
                every_seed(runs, "g2", lambda x: x >= 3),
            )
        )
    for v in ("sinklogit", "offbyone"):
        if v in have:
            base_r0 = per_seed(runs, "baseline", "r0_later")
            r0 = per_seed(runs, v, "r0_later")
            nearer = bool(((1 - r0).abs() < (1 - base_r0).abs()).dropna().all())
            lower = bool((diffs(runs, v, "pos0_over_uniform") < 0).all())
            ph = mean(v, "phantom_share")
            out.append(
                (
                    "Wang 2026" if v == "sinklogit" else "Miller 2023 / Wang 2026",
                    "the phantom key takes the mass BOS took: position-0 share falls, the BOS read is no longer "
                    "drained (r0 → 1), the mass moves to the phantom",
                    "phantom share > 0.1, lower pos0 ÷ uniform and r0 nearer 1 than the baseline in every seed pair",
                    f"phantom {ph:.3f}, pos0 ÷ uniform {mean(v, 'pos0_over_uniform'):.2f}, "
                    f"r0 {mean(v, 'r0_later'):.2f} "
                    f"(baseline {mean('baseline', 'pos0_over_uniform'):.2f}, {mean('baseline', 'r0_later'):.2f})",
                    ph > 0.1 and lower and nearer,
                )
            )
    for v in ("normgate", "projgate"):
        if v in have:
            out.append(
                (
                    "Wang 2026",
                    f"a gate determined by each value alone ({'norm' if v == 'normgate' else 'projection'} gate) "
                    "leaves the attention sink in place",
                    "pos0 ÷ uniform still ≥ 3× in every seed",
                    f"pos0 ÷ uniform {mean(v, 'pos0_over_uniform'):.2f} (per seed {seeds(v)}), r0 "
                    f"{mean(v, 'r0_later'):.2f}",
                    every_seed(runs, v, lambda x: x >= 3),
                )
            )
    if "routing-normgate" in have:
        loss = diffs(runs, "routing-normgate", "loss")
        out.append(
            (
                "Wang 2026",
                "a gate confined to the routing slot opens almost fully and yields no benefit",
                "mean gate ≥ 0.9 and no loss below the baseline's in every pair",
                f"mean gate {mean('routing-normgate', 'mean_gate'):.3f}, loss − baseline per pair "
                f"{fmt_d('routing-normgate', 'loss', '{:+.4f}')}",
                mean("routing-normgate", "mean_gate") >= 0.9 and not bool((loss < 0).all()),
            )
        )
    if "sinktoken" in have:
        out.append(
            (
                "Wang 2026",
                "the sink token absorbs the abstained mass itself (its learned value still reaches the output)",
                "pos0 ÷ uniform (position 0 is the learned token) ≥ 3× in every seed",
                f"pos0 ÷ uniform {mean('sinktoken', 'pos0_over_uniform'):.2f} (per seed {seeds('sinktoken')}), r0 "
                f"{mean('sinktoken', 'r0_later'):.2f}",
                every_seed(runs, "sinktoken", lambda x: x >= 3),
            )
        )
    if "value-residual" in have:
        d = diffs(runs, "value-residual", "pos0_over_uniform")
        out.append(
            (
                "Zhou et al. 2024",
                "the value residual flattens the sink (their account is correlational)",
                "lower pos0 ÷ uniform than the baseline in every seed pair",
                f"pos0 ÷ uniform {mean('value-residual', 'pos0_over_uniform'):.2f} "
                f"(per pair {fmt_d('value-residual', 'pos0_over_uniform')})",
                bool((d < 0).all()),
            )
        )
    if "gatedv" in have:
        out.append(
            (
                "GatedV",
                "(no claim about sinks: the paper reports perplexity only)",
                "–",
                f"pos0 ÷ uniform {mean('gatedv', 'pos0_over_uniform'):.2f}, r0 {mean('gatedv', 'r0_later'):.2f}",
                None,
            )
        )
    return out


# Gu et al. 2025's similarity ablation (their 60M LLaMA, Sink^ε with ε = 0.3): rows that are not normalised leave
# no sink (sigmoid: 18.18 % → 0.44 %), the same kernels divided by their row sum have one again
GU_NO_SINK = "without normalisation {rule} rows leave no attention sink (their 60M model: Sink^ε 18.18 % with softmax"
GU_NO_SINK += ", 0.44 % with unnormalised sigmoid rows)"
GU_SINK = "normalised {rule} rows (divided by their sum) have an attention sink again: the row's normalisation, not"
GU_SINK += " the kernel, makes the sink"
# rules whose papers make no claim about sinks (their abstracts do not mention one): measured, no verdict
NO_CLAIM = {
    "sigmoid": ("Ramapuram et al. 2024", "sigmoid attention with b = −log n"),
    "stickbreaking": ("Tan et al. 2025", "stick-breaking attention"),
    "fox": ("Lin et al. 2025", "the Forgetting Transformer"),
    "fox-pro-partial": ("Lin et al. 2025", "the Forgetting Transformer with probe's part of its Pro block"),
    "diff": ("Ye et al. 2024", "differential attention (its claim is about activation outliers, above)"),
}


def rule_claims(runs: pd.DataFrame) -> list[tuple[str, str, str, str, bool | None]]:
    """The attention-rule papers' claims: softpick (Zuhri et al.), Gu et al.'s kernels with and without the row's
    normalisation, and what the recipe measured for the rules whose papers claim nothing about sinks."""
    have = set(runs["variant"])
    out: list[tuple[str, str, str, str, bool | None]] = []
    if "softpick" in have:
        out.append(
            (
                "Zuhri et al. 2025",
                "softpick removes the attention sink (their sink rate falls to 0 %)",
                REMOVES_RULE,
                sink_measured(runs, "softpick") + f"; Sink^0.3 {run_mean(runs, 'softpick', 'sink_eps_share'):.2f} "
                f"(baseline {run_mean(runs, 'baseline', 'sink_eps_share'):.2f})",
                removes_sink(runs, "softpick"),
            )
        )
        out.append(massive_claim(runs, "Zuhri et al. 2025", "softpick removes massive activations", "softpick"))
    if "diff" in have:  # their "reduction of activation outliers"; the paper makes no claim about the sink itself
        out.append(massive_claim(runs, "Ye et al. 2024", "differential attention reduces activation outliers", "diff"))
    for v, rule, form in (
        ("sigmoid", "sigmoid", "; here with Ramapuram et al.'s b = −log n_ctx inside the sigmoid, theirs has none"),
        ("elu1", "ELU+1", ""),
    ):
        if v in have:
            claim = GU_NO_SINK.format(rule=rule) + form
            out.append(("Gu et al. 2025", claim, REMOVES_RULE, sink_measured(runs, v), removes_sink(runs, v)))
    for v, rule in (("sigmoid-norm", "sigmoid"), ("elu1-norm", "ELU+1")):
        if v in have:
            stays = every_seed(runs, v, lambda x: x >= 3)
            out.append(("Gu et al. 2025", GU_SINK.format(rule=rule), STAYS_RULE, sink_measured(runs, v), stays))
    for v, (paper, what) in NO_CLAIM.items():
        if v in have:
            claim = f"no claim about sinks for {what}; measured for comparison"
            out.append((paper, claim, "–", sink_measured(runs, v), None))
    return out


def claims_table(rows, n_seeds: int) -> str:
    """The claims beside the measurements; with one seed the verdict says so (one pair, no standard error)."""
    lines = ["| paper | claim | rule here | measured | agrees? |", "|---|---|---|---|---|"]
    on = "" if n_seeds > 1 else " on one seed"
    for paper, claim, rule, measured, agrees in rows:
        verdict = "–" if agrees is None else ("agrees" if agrees else "does not") + on
        cells = (c.replace("|", "\\|") for c in (paper, claim, rule, measured, verdict))  # |h| in a table cell
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def screenshot(fig, png: Path, size: tuple[int, int]) -> None:
    """The figure as headless Chromium draws it (the browser tests/present/test_browser.py drives; PROBE_CHROMIUM
    names another): a self-contained HTML page, screenshot to ``png``."""
    names = (os.environ.get("PROBE_CHROMIUM"), "chromium", "chromium-browser", "google-chrome", "chrome")
    browser = next((shutil.which(n) for n in names if n and shutil.which(n)), None)
    if browser is None:
        raise SystemExit("--png needs a Chromium (chromium, google-chrome, or PROBE_CHROMIUM)")
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "figure.html"
        fig.write_html(page, include_plotlyjs=True, full_html=True, config={"staticPlot": True})
        shot = Path(tmp) / "figure.png"
        subprocess.run(
            [
                browser,
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                f"--user-data-dir={tmp}/profile",
                f"--window-size={size[0]},{size[1]}",
                "--virtual-time-budget=20000",
                f"--screenshot={shot}",
                page.as_uri(),
            ],
            check=True,
            capture_output=True,
            timeout=300,
        )
        shutil.move(shot, png)


def cost_table(runs: pd.DataFrame, variants) -> str:
    """Per variant each seed's training CPU-seconds and wall seconds (the recipe's train_cpu_s and train_wall_s, in seed
    order), then the totals over every run."""
    lines = [
        "| variant | training CPU-s per seed | training wall-s per seed |",
        "|---|---|---|",
    ]
    for v in variants:
        r = runs[runs["variant"] == v].sort_values("seed")
        cpu, wall = (", ".join(f"{x:,.0f}" for x in r[c]) for c in ("train_cpu_s", "train_wall_s"))
        lines.append(f"| `{v}` | {cpu} | {wall} |")
    total = (
        f"{len(runs)} runs: {runs['train_cpu_s'].sum():,.0f} CPU-seconds and {runs['train_wall_s'].sum():,.0f} "
        f"wall-seconds of training summed over the runs ({runs['train_cpu_s'].min():,.0f}–"
        f"{runs['train_cpu_s'].max():,.0f} CPU-s per run)."
    )
    return "\n".join(lines) + "\n\n" + total


def seeds_line(seeds, steps: int) -> str:
    if len(seeds) > 1:
        return (
            f"Seeds {', '.join(map(str, seeds))}; {steps} steps; cells: mean over seeds (paired difference from the "
            "baseline ± its standard error over seed pairs)."
        )
    return (
        f"Seed {seeds[0]} only, {steps} steps: cells are that one run's value (difference from the baseline's run "
        "with the same seed); one pair has no standard error."
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="a finished probe experiment sink-removal folder")
    ap.add_argument("--md", type=Path, help="the page whose marked section to rewrite (else: print)")
    ap.add_argument("--png", type=Path, help="write the figure here")
    ap.add_argument("--section", choices=sorted(SECTIONS), default="gates", help="which marked section (default gates)")
    args = ap.parse_args(argv)
    summary = pd.read_csv(args.out / "summary.csv")
    runs = pd.read_csv(args.out / "runs.csv")
    config = json.loads((args.out / "config.json").read_text())
    variants = [v for v in config["config"]["variants"] if v in set(runs["variant"])]
    seeds = sorted(runs["seed"].unique())
    parts = [
        seeds_line(seeds, config["config"]["steps"]),
        measured_table(summary.set_index(["variant", "metric"]), variants),
        claims_table(claims(runs), len(seeds)),
    ]
    if args.section in ("rules", "diff"):
        parts.append(cost_table(runs, variants))
    text = "\n\n".join(parts)
    if args.md:
        start, end = SECTIONS[args.section]
        page = args.md.read_text()
        pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.S)
        if not pattern.search(page):
            raise SystemExit(f"{args.md}: no {start} ... {end} section")
        atomic_write(args.md, pattern.sub(lambda _: f"{start}\n{text}\n{end}", page))
    else:
        print(text)
    if args.png:
        fig = removal_figure(summary)
        fig.update_layout(width=1000, height=760)
        screenshot(fig, args.png, (1000, 760))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
