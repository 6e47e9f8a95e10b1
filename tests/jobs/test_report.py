"""`probe report`: batch sink reports, resumable after a kill at any point, with the same numbers and no duplicates."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from probe.errors import UsageError
from probe.jobs.report import expand_checkpoints, step_of
from probe.jobs.store import slug
from tests.support.cli import WINDOWS, assert_one_line_error, files_under, kill_at_model_result, probe


def test_expand_checkpoints():
    assert expand_checkpoints("pythia-160m@step1000,step2000, 4000") == [
        "pythia-160m@step1000",
        "pythia-160m@step2000",
        "pythia-160m@4000",
    ]
    assert expand_checkpoints("a@x,b@step3,5") == ["a@x", "b@step3", "b@5"]
    assert [step_of(n) for n in ("pythia-160m@step1000", "pythia-160m@4000", "x@main", "dir")] == [
        1000,
        4000,
        None,
        None,
    ]
    with pytest.raises(UsageError):
        expand_checkpoints("step1000,step2000")
    with pytest.raises(UsageError):
        expand_checkpoints(",")
    assert slug("a/b") != slug("a_b")  # distinct names never share a result file


def test_report_axis_uses_training_steps():
    from probe.present.report import _axis

    s = pd.DataFrame({"model": ["pythia-160m@step1000", "pythia-160m@step2000"], "step": [1000, 2000]})
    assert _axis(s) == ({"pythia-160m@step1000": 1000, "pythia-160m@step2000": 2000}, "training step of pythia-160m")
    s = pd.DataFrame({"model": ["a", "b"], "step": [None, None]})
    assert _axis(s) == ({"a": "a", "b": "b"}, "model")


def _report(fx, out, *extra, env=None):
    return probe(
        "report",
        "--models",
        fx["sp"],
        fx["llama"],
        fx["base"],
        "--data",
        fx["data"],
        *WINDOWS,
        "--inject-doses",
        "0.4",
        "0.8",
        "--out",
        out,
        *extra,
        env=env,
    )


def test_report_killed_and_resumed_equals_uninterrupted(fx, tmp_path):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    r = _report(fx, whole)
    assert r.returncode == 0, r.stderr
    assert "sink report: 3 models" in r.stdout

    r = _report(fx, cut, env=kill_at_model_result(tmp_path, 1, staged=False))  # killed once model 1 is persisted
    assert r.returncode != 0
    done = sorted(p.name for p in (cut / "models").iterdir())
    assert len(done) == 1 and not (cut / "report_summary.csv").exists()
    first = (cut / "models" / done[0]).stat()

    # resumed, then killed between writing and renaming its first new result: model 2
    r = _report(fx, cut, env=kill_at_model_result(tmp_path, 1, staged=True))
    assert r.returncode != 0
    assert "resuming" in r.stderr and "1 of 3 models already done" in r.stderr
    staged = [p.name for p in (cut / "models").iterdir() if p.name.startswith(".")]
    assert len(staged) == 1 and len([p for p in (cut / "models").iterdir() if not p.name.startswith(".")]) == 1

    r = _report(fx, cut)
    assert r.returncode == 0, r.stderr
    assert "1 of 3 models already done" in r.stderr
    assert (cut / "models" / done[0]).stat().st_mtime_ns == first.st_mtime_ns  # model 1 was not recomputed
    assert not [p for p in files_under(cut) if p.name.startswith(".")]  # the staged file was cleaned up

    for name in (
        "report_summary.csv",
        "report_by_type.csv",
        "report_layers.csv",
        "report_heads.csv",
        "report_sink_eps.csv",
        "report_sink_eps_layers.csv",
        "report_injection.csv",
        "report_exposure.csv",
    ):
        assert (cut / name).read_text() == (whole / name).read_text(), name
    summary = pd.read_csv(cut / "report_summary.csv")
    assert list(summary["model"]) == [str(fx["sp"]), str(fx["llama"]), str(fx["base"])]
    layers = pd.read_csv(cut / "report_layers.csv")
    assert not layers.duplicated(["model", "layer"]).any() and len(layers) == 3 * 2
    inj = pd.read_csv(cut / "report_injection.csv")
    assert not inj.duplicated(["model", "junk", "cutoff", "dose"]).any() and len(inj) == 3 * 2
    assert (summary.set_index("model")["phantom_share"] > 0).to_dict() == {
        str(fx["sp"]): True,
        str(fx["llama"]): False,
        str(fx["base"]): False,
    }  # only sink+proj has a phantom

    page = (cut / "report.html").read_text()
    assert (
        "src='plotly.min.js'" in page
        and (cut / "plotly.min.js").is_file()
        and "report.html" in (cut / "index.html").read_text()
    )
    assert page.count("Plotly.newPlot") == 4 + 1 + 2 + 2  # stats, layer profiles, Sink^eps, injection and exposure
    manifest = json.loads((cut / "manifest.json").read_text())
    assert manifest["settings"]["inject"]["doses"] == [0.4, 0.8] and len(manifest["models"]) == 3

    r = _report(fx, cut, "--seed", "1")  # other settings: refuse to mix numbers
    assert_one_line_error(r, "other settings", "seed: 0 (now 1)")


def test_report_refuses_a_foreign_directory_and_writes_nothing_on_error(fx, tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    assert_one_line_error(_report(fx, foreign), "not a probe report directory")
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]
    out = tmp_path / "out"
    r = probe("report", "--models", fx["bad_weights"], fx["sp"], "--data", fx["data"], *WINDOWS, "--out", out)
    assert_one_line_error(r, "cannot read", "bad_weights")
    assert files_under(out) == []


def test_report_over_checkpoints_carries_each_snapshots_entropy_kurtosis_and_norm_share(fx, tmp_path, cli):
    """`probe report --checkpoints RUN --entropy --kurtosis --norm-weighted`: every snapshot's tables equal what
    `probe sinks` with the same flags measures on that snapshot alone (one sink pass gives both)."""
    run, data = tmp_path / "run", ["--data", fx["data"]]
    train = ["train", "--variant", "baseline", "--tier", "tiny", *data, "--eval-data", fx["data"], "--eval-batches"]
    r = cli(*train, "1", "--steps", "2", "--batch-size", "2", "--ctx", "32", "--snapshot-every", "2", "--out", run)
    assert r.returncode == 0, r.stderr
    flags = ["--entropy", "--kurtosis", "--norm-weighted", *data, *WINDOWS, "--quiet"]
    r = cli("report", "--checkpoints", run, *flags, "--out", tmp_path / "rep")
    assert r.returncode == 0, r.stderr
    assert "sink mechanisms" in r.stdout and "entropy_norm" in r.stdout and "norm_share" in r.stdout
    read = {k: pd.read_csv(tmp_path / "rep" / f"report_{k}.csv") for k in ("summary", "entropy", "kurtosis")}
    read["norm_weighted_layers"] = pd.read_csv(tmp_path / "rep" / "report_norm_weighted_layers.csv")
    assert sorted(read["entropy"]["step"]) == [0, 2] and read["kurtosis"]["kurtosis"].nunique() == 2
    for step in (0, 2):
        alone = cli("sinks", "--model", f"{run}@step{step}", *flags, "--json")
        assert alone.returncode == 0, alone.stderr
        tables = json.loads(alone.stdout)["tables"]
        for report_table, sinks_table, cols in (
            ("summary", "summary", ["pos0_share", "r0_later"]),
            ("entropy", "entropy_summary", ["entropy", "entropy_norm", "entropy_norm_se", "min_layer"]),
            ("kurtosis", "kurtosis_summary", ["kurtosis", "max_kurtosis", "last_kurtosis"]),
            ("norm_weighted_layers", "norm_weighted_layers", ["layer", "share", "norm_share", "key0_norm"]),
        ):
            mine = read[report_table][read[report_table]["step"] == step][cols].reset_index(drop=True)
            theirs = pd.DataFrame(tables[sinks_table])[cols].astype(float)  # JSON's null: NaN, as the CSV reads
            pd.testing.assert_frame_equal(mine.astype(float), theirs, rtol=1e-9)
    page = (tmp_path / "rep" / "report.html").read_text()
    assert "Outlier kurtosis per model" in page and "Attention entropy per model" in page  # their tables


def test_report_refuses_to_resume_with_another_bos_choice(fx, tmp_path, cli):
    """--bos / --no-bos change every window (BOS + ctx-1 text tokens), so a folder computed under one BOS choice is
    not resumed under another: before, the rerun kept the old records and reported them as computed with --bos (on
    this llama r0 0.964 instead of 1.070)."""
    import shutil

    from transformers import AutoTokenizer

    model = tmp_path / "llama-bos"
    shutil.copytree(fx["llama"], model)
    tok = AutoTokenizer.from_pretrained(model)
    tok.bos_token = tok.eos_token  # a tokenizer with a BOS token, not prepended to plain text: --bos changes windows
    tok.save_pretrained(model)
    flags = ["report", "--models", model, "--data", fx["data"], *WINDOWS, "--quiet"]
    assert cli(*flags, "--out", tmp_path / "plain").returncode == 0
    assert cli(*flags, "--bos", "--out", tmp_path / "bos").returncode == 0
    plain, bos = (pd.read_csv(tmp_path / d / "report_summary.csv") for d in ("plain", "bos"))
    assert abs(plain["r0"].iloc[0] - bos["r0"].iloc[0]) > 1e-3  # the choice changes the numbers
    assert json.loads((tmp_path / "bos" / "manifest.json").read_text())["settings"]["bos"] is True
    before = (tmp_path / "plain" / "report_summary.csv").read_text()
    r = cli(*flags, "--bos", "--out", tmp_path / "plain")
    assert_one_line_error(r, "other settings", "bos: None (now True)")
    assert (tmp_path / "plain" / "report_summary.csv").read_text() == before
    assert_one_line_error(cli(*flags, "--no-bos", "--out", tmp_path / "bos"), "bos: True (now False)")
