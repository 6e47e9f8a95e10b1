"""``probe experiment sink-removal`` end to end on a tiny budget (a few steps of four variants, two seeds): the tables
and their columns, paired differences that are the per-seed differences of runs.csv, resume (a rerun trains nothing),
``--jobs 2`` giving the same runs as one job, a finished run shipping to the zoo, and one-line errors."""

import json
import shutil
import subprocess

import pandas as pd
import pytest

from probe.experiments.bb_zoo import ship
from probe.experiments.command import main
from probe.experiments.sink_removal import METRICS, RULE_VARIANTS, VARIANTS, RemovalConfig, summary_tables
from probe.kernels.row_rules import ROW_RULES
from tests.support.cli import assert_one_line_error
from tests.support.scripts import load_script

TINY = [
    "--steps",
    "6",
    "--snapshot-every",
    "3",
    "--warmup",
    "2",
    "--T",
    "24",
    "--batch-size",
    "4",
    "--d-model",
    "32",
    "--d-mlp",
    "64",
    "--n-eval-batches",
    "2",
    "--eval-batch-size",
    "4",
    "--seeds",
    "0",
    "1",
]
FEW = ["baseline", "sinklogit", "normgate", "outgate-head"]


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    out = tmp_path_factory.mktemp("sink_removal") / "out"
    assert main(["sink-removal", "--out", str(out), "--variants", *FEW, "--quiet", *TINY]) == 0
    return out


def test_the_recipe_covers_every_mechanism_the_issue_names():
    assert set(VARIANTS) == {
        "baseline",
        "offbyone",
        "sinklogit",
        "sinktoken",
        "normgate",
        "projgate",
        "routing-normgate",
        "gatedv",
        "g2",
        "outgate",
        "outgate-head",
        "value-residual",
    }


def test_tables_columns_and_paired_differences(recipe):
    runs = pd.read_csv(recipe / "runs.csv")
    assert sorted(zip(runs["variant"], runs["seed"], strict=True)) == sorted((v, s) for v in FEW for s in (0, 1))
    assert set(METRICS) | {"sink_formed", "massive", "gate", "train_cpu_s", "peak_rss_mb"} <= set(runs.columns)
    by = runs.set_index(["variant", "seed"])
    assert by.loc["sinklogit", "phantom_share"].gt(0).all() and by.loc["baseline", "phantom_share"].eq(0).all()
    assert by.loc["baseline", "mean_gate"].isna().all() and by.loc["normgate", "mean_gate"].between(0, 1).all()
    assert by.loc["outgate-head", "gate"].eq("out:headwise").all()
    summary = pd.read_csv(recipe / "summary.csv").set_index(["variant", "metric"])
    for v in FEW[1:]:
        for metric in ("pos0_over_uniform", "max_activation", "loss"):
            diffs = by.loc[v, metric] - by.loc["baseline", metric]  # per seed, variant − baseline
            row = summary.loc[(v, metric)]
            assert row["diff"] == pytest.approx(diffs.mean()) and row["n_pairs"] == 2
            assert row["diff_se"] == pytest.approx(diffs.std(ddof=1) / 2**0.5)
            assert row["mean"] == pytest.approx(by.loc[v, metric].mean())
    assert summary.loc[("normgate", "mean_gate"), "n_pairs"] == 0  # the baseline has no gate to pair with
    layers = pd.read_csv(recipe / "layers.csv")
    assert len(layers) == len(runs) * 2 and {"pos0_over_uniform", "r0", "sink_eps_share"} <= set(layers.columns)
    page = (recipe / "removal.html").read_text()
    assert "position-0 share" in page and "largest activation" in page
    config = json.loads((recipe / "config.json").read_text())
    assert config["recipe"] == "sink-removal" and config["meta"]["peak_rss_mb_run"] > 0


def test_rerun_trains_nothing_and_gives_the_same_tables(recipe):
    metrics = {d.name: (d / "metrics.jsonl").read_text() for d in (recipe / "runs").iterdir()}
    before = pd.read_csv(recipe / "runs.csv")
    assert main(["sink-removal", "--out", str(recipe), "--variants", *FEW, "--quiet", *TINY]) == 0
    assert {d.name: (d / "metrics.jsonl").read_text() for d in (recipe / "runs").iterdir()} == metrics
    pd.testing.assert_frame_equal(pd.read_csv(recipe / "runs.csv"), before)


def test_two_jobs_train_the_same_runs_as_one(recipe, tmp_path):
    out = tmp_path / "jobs2"
    args = ["sink-removal", "--out", str(out), "--variants", "baseline", "outgate-head", "--quiet", *TINY]
    assert main([*args, "--jobs", "2"]) == 0
    two = pd.read_csv(out / "runs.csv").set_index(["variant", "seed"])
    one = pd.read_csv(recipe / "runs.csv").set_index(["variant", "seed"]).loc[two.index]
    pd.testing.assert_frame_equal(two[list(METRICS)], one[list(METRICS)])


def test_a_finished_run_ships_as_a_zoo_entry(recipe, tmp_path):
    rec = ship(recipe / "runs" / "outgate-head-s0", zoo_dir=tmp_path)
    assert rec["name"] == "probe/bb-outgate-head" and "--steps 6" in rec["command"]
    assert (tmp_path / "bb-outgate-head" / "model.safetensors").is_file()


@pytest.mark.parametrize(
    "args, needles",
    [
        (["--variants", "sinklogit", "outgate"], ["baseline"]),
        (["--variants", "baseline", "outgates"], ["'outgates'", "outgate"]),
        (["--jobs", "0"], ["jobs=0"]),
        (["--steps", "250", "--snapshot-every", "100"], ["steps=250", "snapshot_every=100"]),
    ],
)
def test_bad_options_are_one_line_and_write_nothing(args, needles, tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["sink-removal", "--out", str(out), *args])
    assert_one_line_error(subprocess.CompletedProcess([], code, *capsys.readouterr()), *needles)
    assert not out.exists()


@pytest.mark.parametrize("seeds", [(0, 1), (0,)])
def test_the_results_page_tables_come_from_the_recipes_tables(recipe, seeds, tmp_path):
    """scripts/sink_removal_page.py rewrites only the page's marked section, with a row per variant and a claim per
    mechanism; with one seed no cell carries a standard error (nan) and every verdict says it rests on one seed."""
    page = load_script("scripts/sink_removal_page.py", "sink_removal_page")
    out = tmp_path / "out"
    out.mkdir()
    runs = pd.read_csv(recipe / "runs.csv")
    runs = runs[runs["seed"].isin(seeds)]
    runs.to_csv(out / "runs.csv", index=False)
    summary_tables(runs)[0].to_csv(out / "summary.csv", index=False)
    (out / "config.json").write_text((recipe / "config.json").read_text())
    md = tmp_path / "page.md"
    md.write_text(f"# title\n\nbefore\n\n{page.START}\nold\n{page.END}\n\nafter\n")
    assert page.main([str(out), "--md", str(md)]) == 0
    text = md.read_text()
    assert text.startswith("# title\n\nbefore\n\n") and text.endswith("\n\nafter\n") and "\nold\n" not in text
    table = text.split(page.START)[1].split(page.END)[0]
    for v in FEW:
        assert f"| `{v}` |" in table
    assert "nan" not in table and "Qiu et al. 2025" in table and "Wang 2026" in table
    qiu = [line for line in table.splitlines() if line.startswith("| Qiu")]
    verdicts = [line.rsplit("|", 2)[1].strip() for line in qiu if "massive activations" not in line]
    assert verdicts and all(v.startswith(("agrees", "does not")) for v in verdicts)
    (massive,) = [line for line in qiu if "massive activations" in line]
    if not runs[runs["variant"] == "baseline"]["massive"].all():  # a tiny baseline has none: nothing to remove
        assert "the claim is not tested" in massive and massive.endswith("| – |")
    if len(seeds) == 1:
        assert "Seed 0 only" in table and " ± " not in table and all(v.endswith("on one seed") for v in verdicts)
    else:
        assert " ± " in table and not any("one seed" in v for v in verdicts)


def test_threshold_verdicts_hold_in_every_seed_not_on_the_mean():
    """A G1 run below the baseline in every pair, with a mean under 3x but one seed at 4.2x, does not remove the
    sink; a value gate above 3x in every seed leaves it in place, one seed under 3x does not."""
    page = load_script("scripts/sink_removal_page.py", "sink_removal_page")

    def runs(outgate, projgate):
        rows = []
        for seed in range(3):
            for variant, pos0 in (("baseline", 5.0), ("outgate", outgate[seed]), ("projgate", projgate[seed])):
                rows.append(
                    dict(
                        variant=variant,
                        seed=seed,
                        pos0_over_uniform=pos0,
                        r0_later=0.5,
                        massive=False,
                        max_activation=20.0,
                        max_ratio=9.0,
                        mean_gate=0.3,
                        selectivity=0.1,
                        loss=2.0,
                    )
                )
        return pd.DataFrame(rows)

    def verdicts(r):
        return {(claim, rule): agrees for _, claim, rule, _, agrees in page.claims(r)}

    def removes(r):
        return next(a for (c, _), a in verdicts(r).items() if c.startswith("G1 (element-wise) removes the first"))

    def stays(r):
        return next(a for (c, _), a in verdicts(r).items() if "projection gate" in c)

    assert removes(runs((1.0, 4.2, 1.0), (4.0, 4.0, 4.0))) is False  # mean 2.07 < 3, seed 1 at 4.2
    assert removes(runs((1.0, 2.9, 1.0), (4.0, 4.0, 4.0))) is True
    assert stays(runs((1.0, 1.0, 1.0), (9.0, 9.0, 2.0))) is False  # mean 6.7, seed 2 under 3x
    assert stays(runs((1.0, 1.0, 1.0), (3.0, 9.0, 4.0))) is True


RULES_FEW = ["baseline", "softpick", "elu1-norm", "fox"]


def test_the_rules_group_names_every_new_attention_rule_and_leaves_the_default_alone():
    # every rule the models register, both FoX forms, each once, after the one baseline
    assert RULE_VARIANTS[0] == "baseline" and len(set(RULE_VARIANTS)) == len(RULE_VARIANTS)
    assert set(RULE_VARIANTS) == {"baseline", *ROW_RULES, "fox", "fox-pro-partial", "diff"}
    assert RemovalConfig().variants == VARIANTS and not set(VARIANTS) & set(RULE_VARIANTS[1:])
    assert RemovalConfig(variants=("rules",)).variants == RULE_VARIANTS
    both = RemovalConfig(variants=("gates", "rules")).variants  # the baseline both groups hold comes once
    assert both == VARIANTS + RULE_VARIANTS[1:]
    assert RemovalConfig(variants=("sigmoid", "baseline")).variants == ("sigmoid", "baseline")


def test_a_group_does_not_hide_a_repeated_name(tmp_path, capsys):
    code = main(["sink-removal", "--out", str(tmp_path / "out"), "--variants", "rules", "softpick", "softpick"])
    assert_one_line_error(subprocess.CompletedProcess([], code, *capsys.readouterr()), "softpick")


@pytest.fixture(scope="module")
def rules_recipe(tmp_path_factory):
    out = tmp_path_factory.mktemp("sink_removal_rules") / "out"
    assert main(["sink-removal", "--out", str(out), "--variants", *RULES_FEW, "--quiet", *TINY]) == 0
    return out


def test_the_rules_page_section_comes_from_a_rules_grid(rules_recipe, tmp_path):
    """The rule variants train and measure in the recipe (softpick leaves its unspent mass as the phantom share, the
    normalised ELU+1 rows and FoX none); --section rules rewrites only the rules section, with each paper's claim, a
    verdict where the paper makes a claim, and each run's training cost from runs.csv."""
    runs = pd.read_csv(rules_recipe / "runs.csv")
    by = runs.set_index(["variant", "seed"])
    assert sorted(zip(runs["variant"], runs["seed"], strict=True)) == sorted((v, s) for v in RULES_FEW for s in (0, 1))
    assert by.loc["softpick", "phantom_share"].ge(0).all() and by.loc["fox", "phantom_share"].eq(0).all()
    assert by.loc["elu1-norm", "phantom_share"].abs().lt(1e-5).all()  # ε's share only
    page = load_script("scripts/sink_removal_page.py", "sink_removal_page")
    md = tmp_path / "page.md"
    gates = f"{page.START}\ngates table\n{page.END}"
    start, end = page.SECTIONS["rules"]
    md.write_text(f"# title\n\n{gates}\n\n{start}\nold\n{end}\n")
    assert page.main([str(rules_recipe), "--md", str(md), "--section", "rules"]) == 0
    text = md.read_text()
    assert gates in text and "\nold\n" not in text
    section = text.split(start)[1].split(end)[0]
    for v in RULES_FEW:
        assert f"| `{v}` |" in section
    rows = [line for line in section.splitlines() if line.startswith(("| Zuhri", "| Gu", "| Lin"))]
    verdict = {line.split("|")[2].strip(): line.rsplit("|", 2)[1].strip() for line in rows}
    assert verdict["softpick removes the attention sink (their sink rate falls to 0 %)"] in ("agrees", "does not")
    assert any(c.startswith("normalised ELU+1 rows") and v in ("agrees", "does not") for c, v in verdict.items())
    assert any(c.startswith("no claim about sinks") and v == "–" for c, v in verdict.items())
    cpu = by.loc["fox", "train_cpu_s"].sort_index()
    assert f"| `fox` | {cpu.iloc[0]:,.0f}, {cpu.iloc[1]:,.0f} |" in section
    assert f"{len(runs)} runs: {runs['train_cpu_s'].sum():,.0f} CPU-seconds" in section


def test_gu_verdicts_hold_in_every_seed_not_on_the_mean():
    """Unnormalised ELU+1 leaves no sink only when every seed is under 3x and below its baseline; its normalised form
    has a sink only when every seed is at 3x or more."""
    page = load_script("scripts/sink_removal_page.py", "sink_removal_page")

    def runs(elu1, elu1_norm):
        rows = []
        for seed in range(3):
            for variant, pos0 in (("baseline", 5.0), ("elu1", elu1[seed]), ("elu1-norm", elu1_norm[seed])):
                rows.append(dict(variant=variant, seed=seed, pos0_over_uniform=pos0))
        return pd.DataFrame(rows)

    def verdict(r, start):
        return next(a for _, c, _, _, a in page.rule_claims(r) if c.startswith(start))

    assert verdict(runs((1.0, 2.0, 1.5), (4.0, 4.0, 4.0)), "without normalisation ELU+1") is True
    assert verdict(runs((1.0, 3.5, 1.5), (4.0, 4.0, 4.0)), "without normalisation ELU+1") is False  # mean 2 < 3
    assert verdict(runs((1.0, 1.0, 1.0), (4.0, 9.0, 3.0)), "normalised ELU+1") is True
    assert verdict(runs((1.0, 1.0, 1.0), (9.0, 9.0, 2.5)), "normalised ELU+1") is False  # mean 6.8 ≥ 3


def test_a_rerun_naming_fewer_seeds_measures_nothing_again(recipe, tmp_path):
    """A finished run's measurement is reused whatever grid names it: the tables of seed 0 alone are seed 0's rows of
    the two-seed grid, and no run's removal_stats.json is rewritten."""
    out = tmp_path / "copy"
    shutil.copytree(recipe, out)
    stats = {d.name: (d / "removal_stats.json").read_bytes() for d in (out / "runs").iterdir()}
    assert main(["sink-removal", "--out", str(out), "--variants", *FEW, "--quiet", *TINY[:-3], "--seeds", "0"]) == 0
    assert {d.name: (d / "removal_stats.json").read_bytes() for d in (out / "runs").iterdir()} == stats
    both = pd.read_csv(recipe / "runs.csv")
    pd.testing.assert_frame_equal(
        pd.read_csv(out / "runs.csv"), both[both["seed"] == 0].reset_index(drop=True), check_dtype=False
    )
