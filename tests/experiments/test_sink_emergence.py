"""``probe experiment sink-emergence`` on a few dozen steps of two tiny variants: the files and their columns,
resume (a second call trains nothing), the Done-when table, one-line errors; the recipe's defaults are the sweep's grid
point lr3e-3 (the training the zoo's probe/bb-* models come from); a finished run ships as a zoo entry that loads with
its chain as default data."""

import dataclasses
import json
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import torch

import probe
from probe.analyses.sensitivity import SensitivityOptions
from probe.experiments import sink_emergence
from probe.experiments.bb_zoo import ship
from probe.experiments.command import main
from probe.experiments.sink_emergence import EXTRA, RUN_STATS, SENSITIVITY, EmergenceConfig
from probe.jobs.inputs import trained_task
from probe.runs import snapshot_steps
from probe.train.checkpoint import load_model
from tests.support.analyses import full_jacobian_norms
from tests.support.cli import assert_one_line_error
from tests.support.scripts import load_script

REPO = Path(__file__).resolve().parents[2]
TINY = [
    "--steps",
    "24",
    "--snapshot-every",
    "12",
    "--warmup",
    "4",
    "--T",
    "32",
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
]


def sweep_module():
    return load_script("scripts/sink_emergence_sweep.py", "sink_emergence_sweep")


def test_recipe_defaults_are_the_sweep_point_lr3e_3():
    point = sweep_module().point_config("sweep", "lr3e-3", threads=1)
    default = EmergenceConfig()
    training = [f.name for f in dataclasses.fields(EmergenceConfig) if f.name not in ("variants", "seeds")]
    assert {k: getattr(point, k) for k in training} == {k: getattr(default, k) for k in training}
    assert point.train_config(0) == default.train_config(0) and point.overrides() == default.overrides()
    assert (
        default.lr,
        default.steps,
        default.T,
        default.n_heads,
        default.n_eval_batches * default.eval_batch_size,
    ) == (3e-3, 1200, 256, 1, 256)


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    out = tmp_path_factory.mktemp("sink_emergence") / "out"
    assert main(["sink-emergence", "--out", str(out), "--variants", "baseline", "sinklogit", "--quiet", *TINY]) == 0
    return out


def test_recipe_writes_snapshots_summary_done_when_and_trajectories(recipe):
    snaps = pd.read_csv(recipe / "snapshots.csv")
    assert {
        "variant",
        "seed",
        "step",
        "layer",
        "pos0_ratio",
        "r0",
        "phantom_share",
        "sink_logit",
        "prev_at_trigger",
        "bos_elsewhere",
        *EXTRA,
        *RUN_STATS,
        *SENSITIVITY,
    } <= set(snaps.columns)
    assert sorted(snaps.groupby(["variant", "step"]).size().items()) == [
        ((v, s), 2) for v in ("baseline", "sinklogit") for s in (0, 12, 24)
    ]  # two layers per snapshot
    assert snaps.loc[snaps["variant"] == "baseline", "phantom_share"].eq(0).all()
    assert snaps.loc[snaps["variant"] == "sinklogit", "phantom_share"].gt(0).all()
    summary = pd.read_csv(recipe / "summary.csv")
    assert list(summary.columns) == ["variant", "seed", "step", *RUN_STATS] and len(summary) == 6
    done = pd.read_csv(recipe / "done_when.csv")
    assert list(done["step"]) == [12, 24] and not done["baseline_sink_formed"].any()  # 24 steps form no sink
    assert (
        done["all_met"]
        == done[[c for c in done if c.startswith(("baseline_sink", "sinklogit_")) and done[c].dtype == bool]].all(
            axis=1
        )
    ).all()
    page = (recipe / "trajectories.html").read_text()
    assert "baseline s0" in page and "sinklogit s0" in page
    config = json.loads((recipe / "config.json").read_text())
    assert config["recipe"] == "sink-emergence" and config["config"]["steps"] == 24


def test_each_snapshot_carries_the_last_tokens_sensitivity_per_layer(recipe, tmp_path, monkeypatch):
    """The sensitivity columns at each (snapshot, layer): exact, they are the full Jacobian's shares taken by hand on
    the first evaluation batch; the recipe's sampled ones lie near them."""
    run = tmp_path / "baseline-s0"
    shutil.copytree(recipe / "runs" / "baseline-s0", run)
    (run / "snapshot_stats.csv").unlink()
    monkeypatch.setattr(sink_emergence, "SENSITIVITY_OPTIONS", SensitivityOptions(layers="all"))  # exact
    cfg = EmergenceConfig.from_record(json.loads((run / "emergence.json").read_text())["config"])
    exact = sink_emergence.snapshot_table(cfg, "baseline", 0, run)
    sampled = pd.read_csv(recipe / "snapshots.csv").query("variant == 'baseline'").reset_index(drop=True)
    ids = cfg.task.eval_windows(cfg.n_eval_batches, cfg.eval_batch_size).tokens[0, :, :-1]  # (4, 32)
    for step, path in snapshot_steps(run).items():
        model = sink_emergence.build(cfg, "baseline", 0)
        load_model(model, path)
        model.eval()
        for layer in (0, 1):
            norms = torch.stack([full_jacobian_norms(model, ids[b : b + 1], layer) for b in range(len(ids))])  # (4, T)
            share = (norms / norms.sum(-1, keepdim=True)).double()
            row = exact[(exact["step"] == step) & (exact["layer"] == layer)].iloc[0]
            assert row["sens_first_share"] == pytest.approx(float(share[:, 0].mean()), rel=1e-4)
            assert row["sens_mixing"] == pytest.approx(float(share[:, 1:-1].sum(-1).mean()), rel=1e-4)
    # 16 directions per window: the mixing share (a sum over 30 positions) within a few per cent of exact
    assert sampled["sens_mixing"].to_numpy() == pytest.approx(exact["sens_mixing"].to_numpy(), rel=0.1)


def test_rerun_trains_nothing_and_gives_the_same_tables(recipe):
    metrics = {d.name: (d / "metrics.jsonl").read_text() for d in (recipe / "runs").iterdir()}
    before = pd.read_csv(recipe / "snapshots.csv")
    assert main(["sink-emergence", "--out", str(recipe), "--variants", "baseline", "sinklogit", "--quiet", *TINY]) == 0
    assert {d.name: (d / "metrics.jsonl").read_text() for d in (recipe / "runs").iterdir()} == metrics
    timing = [json.loads(line) for line in (recipe / "runs" / "baseline-s0" / "timing.jsonl").read_text().splitlines()]
    assert [t["step"] for t in timing] == [24, 24]
    pd.testing.assert_frame_equal(pd.read_csv(recipe / "snapshots.csv"), before)


def test_a_rerun_of_other_settings_is_refused_and_other_evaluation_windows_are_measured_again(recipe, tmp_path, capsys):
    """Rerun into a finished --out with another chain, the trainer reloaded the old weights, the run's record was
    rewritten to claim the new chain, and the cached statistics (kept per snapshot step only) came back unchanged.
    Another chain is a one-line error that leaves the record as it was; other evaluation windows (more batches) are
    measured again on the same weights."""
    out = tmp_path / "out"
    shutil.copytree(recipe, out)
    record = (out / "runs" / "baseline-s0" / "probe_train.json").read_text()
    args = ["sink-emergence", "--out", str(out), "--variants", "baseline", "sinklogit", "--quiet", *TINY]
    assert main([*args, "--triggers", "5", "--chain-seed", "7"]) == 2
    err = capsys.readouterr().err
    assert "baseline-s0 holds a run trained with other settings (different data, task)" in err
    assert (out / "runs" / "baseline-s0" / "probe_train.json").read_text() == record
    more = [
        *args[: args.index("--n-eval-batches")],
        "--n-eval-batches",
        "3",
        *args[args.index("--n-eval-batches") + 2 :],
    ]
    assert main(more) == 0
    before, after = pd.read_csv(recipe / "snapshots.csv"), pd.read_csv(out / "snapshots.csv")
    assert len(after) == len(before) and not after["loss_copy"].equals(before["loss_copy"])
    assert json.loads((out / "runs" / "baseline-s0" / "snapshot_stats.json").read_text())["n_eval_batches"] == 3


def test_a_finished_run_ships_as_a_zoo_entry(recipe, tmp_path):
    rec = ship(recipe / "runs" / "baseline-s0", zoo_dir=tmp_path)
    assert rec["name"] == "probe/bb-baseline" and "--steps 24" in rec["command"] and "--T 32" in rec["command"]
    model = probe.load(tmp_path / "bb-baseline")
    assert trained_task(model).spec() == "synthetic:bb[vocab=64,triggers=3,seed=0,T=32]"
    assert model.probe_info.trained_with_bos and len(rec["stats"]["layers"]) == 2


@pytest.mark.parametrize(
    "args, needles",
    [
        (["--variants", "baseline", "sinkylogit"], ["'sinkylogit'", "sinklogit", "baseline"]),
        (["--vocab", "2"], ["vocab=2", "at least 4"]),
        (["--steps", "0"], ["steps=0"]),
    ],
)
def test_bad_options_are_one_line_and_write_nothing(args, needles, tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["sink-emergence", "--out", str(out), *args])
    assert_one_line_error(subprocess.CompletedProcess([], code, *capsys.readouterr()), *needles)
    assert not out.exists()
