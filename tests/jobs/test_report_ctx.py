"""`probe report --ctx T1 T2 ...`: every model at every context length in one resumable run, one record per (model, T),
each model's context sweep as `probe sinks --ctx` computes it; shards merged equal the unsharded run; conflicts are
one-line errors. In-process CLI calls (one import), tiny models, T = 8 / 16 / 32."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.jobs.test_report_shards import PLOTLY_ID
from tests.support.cli import assert_one_line_error, files_under

WINDOWS = ["--batches", "1", "--batch-size", "2"]
CTX_CSVS = ("report_ctx_summary.csv", "report_ctx_by_type.csv", "report_ctx_layers.csv")


@pytest.fixture(scope="module")
def g3(tmp_path_factory):
    """A tiny Gemma 3 (two sliding layers of window 4, then a full one) with its tokenizer."""
    from probe.checkpoints.tiny import build_tiny

    return build_tiny("gemma3_text", tmp_path_factory.mktemp("g3") / "g3")


def _report(cli, fx, out, *models, ctx=("16", "32"), extra=()):
    return cli("report", "--models", *models, "--data", fx["data"], *WINDOWS, "--ctx", *ctx, "--out", out, *extra)


def _in_process_sweep(model_dir, data, contexts, massive=False):
    """sink_context_sweep on the model and windows the report reads (loaded as probe sinks --ctx loads them)."""
    from probe.analyses.context_sweep import sink_context_sweep
    from probe.console import Console
    from probe.jobs.inputs import load_model, windows_for
    from probe.jobs.specs import ModelSpec, WindowSpec

    model = load_model(ModelSpec(name=str(model_dir)), Console(True))
    spec = WindowSpec(data=str(data), batches=1, batch_size=2)
    windows = {t: windows_for(WindowSpec(**{**spec.__dict__, "ctx": t}), model)[0] for t in contexts}
    return sink_context_sweep(model, windows, eps=[0.3], massive=massive)[0]


def _assert_same_numbers(got: pd.DataFrame, want: pd.DataFrame, keys, where: str):
    """Every numeric column the two share, row for row on ``keys``, to 1e-12 (NaN where the other has NaN)."""
    got, want = got.set_index(keys).sort_index(), want.set_index(keys).sort_index()
    assert list(got.index) == list(want.index), where
    cols = [c for c in want.columns if c in got and pd.api.types.is_numeric_dtype(want[c]) and want[c].dtype != bool]
    assert {"pos0_share", "uniform_ref", "r0", "sink_share"} & set(cols), (where, cols)
    assert not {"massive_top1", "max_magnitude"} & set(want) or {"massive_top1", "max_magnitude"} & set(cols)
    for c in cols:
        np.testing.assert_allclose(got[c].astype(float), want[c].astype(float), rtol=1e-12, err_msg=f"{where}:{c}")


def test_report_over_two_contexts_equals_the_sink_context_sweep(cli, fx, g3, tmp_path):
    out = tmp_path / "sweep"
    r = _report(cli, fx, out, fx["sp"], g3, ctx=("32", "16"), extra=("--massive",))  # any order: ascending
    assert r.returncode == 0, r.stderr
    assert "contexts 16 32" in r.stdout
    names = [str(fx["sp"]), str(g3)]
    summary = pd.read_csv(out / "report_summary.csv")
    assert list(zip(summary["model"], summary["ctx"])) == [(n, t) for n in names for t in (16, 32)]
    layers = pd.read_csv(out / "report_layers.csv")
    assert len(layers) == 2 * 2 + 3 * 2 and not layers.duplicated(["model", "ctx", "layer"]).any()
    assert len(list((out / "models").iterdir())) == 4 and len(list((out / "inputs").iterdir())) == 4
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["settings"]["ctx"] == "sweep" and manifest["contexts"] == [16, 32]
    assert manifest["settings"]["massive"] is True and len(pd.read_csv(out / "report_massive.csv")) == 4
    assert manifest["models"] == names

    ctx = {name: pd.read_csv(out / name) for name in CTX_CSVS}
    by_type = ctx["report_ctx_by_type.csv"]
    g3_types = by_type[by_type["model"] == str(g3)]
    assert set(zip(g3_types["ctx"], g3_types["layer_type"])) == {(t, k) for t in (16, 32) for k in ("sliding", "full")}
    for name in names:  # each model's sweep is sink_context_sweep's on the same model and windows
        want = _in_process_sweep(name, fx["data"], (16, 32), massive=True)
        for table, keys in (("summary", ["ctx"]), ("by_type", ["ctx", "layer_type"]), ("layers", ["ctx", "layer"])):
            got = ctx[f"report_ctx_{table}.csv"]
            _assert_same_numbers(got[got["model"] == name], want[table], keys, f"{name} {table}")

    # and `probe sinks --ctx` on the same model and windows writes the same sweep
    sinks = ("sinks", "--model", fx["sp"], "--data", fx["data"], *WINDOWS, "--ctx", "16", "32", "--massive")
    r = cli(*sinks, "--out", tmp_path / "s")
    assert r.returncode == 0, r.stderr
    for table, keys in (("summary", ["ctx"]), ("by_type", ["ctx", "layer_type"]), ("layers", ["ctx", "layer"])):
        got = ctx[f"report_ctx_{table}.csv"]
        want = pd.read_csv(tmp_path / "s" / f"sinks_ctx_{table}.csv")
        _assert_same_numbers(got[got["model"] == str(fx["sp"])], want, keys, f"sinks --ctx {table}")

    # each (model, T) row is the one-context report's at that T
    r = _report(cli, fx, tmp_path / "one", fx["sp"], ctx=("16",), extra=("--massive",))
    assert r.returncode == 0, r.stderr
    one = pd.read_csv(tmp_path / "one" / "report_summary.csv")
    assert "Massive activations" in (tmp_path / "one" / "report.html").read_text()
    assert "ctx" not in one and not list((tmp_path / "one").glob("report_ctx_*"))  # one --ctx: the report as before
    at16 = summary[(summary["model"] == str(fx["sp"])) & (summary["ctx"] == 16)].drop(columns="ctx")
    pd.testing.assert_frame_equal(at16.reset_index(drop=True), one)

    page = (out / "report.html").read_text()
    assert "against context length" in page and page.count("Plotly.newPlot") == 2  # one figure per model
    assert "largest |activation| entering the layer" in page  # the massive-activation panel
    assert "causal-uniform" in page and "Per model, context length and layer type" in page


def test_killed_sweep_resumes_only_the_missing_model_context_pairs(cli, fx, tmp_path, monkeypatch):
    import probe.jobs.report as report

    real, calls, stop = report.compute_one, [], [None]

    def counted(spec, name, index, windows, console, model=None, ctx=None):
        calls.append((Path(name).name, ctx))
        if len(calls) == stop[0]:
            raise KeyboardInterrupt  # killed while computing this pair
        return real(spec, name, index, windows, console, model, ctx)

    monkeypatch.setattr(report, "compute_one", counted)
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert _report(cli, fx, whole, fx["sp"], fx["base"]).returncode == 0
    assert calls == [("sp", 16), ("sp", 32), ("base", 16), ("base", 32)]

    calls.clear()
    stop[0] = 3
    assert _report(cli, fx, cut, fx["sp"], fx["base"]).returncode == 130
    assert len(list((cut / "models").iterdir())) == 2 and not (cut / "report_summary.csv").exists()
    done = {p.name: p.stat().st_mtime_ns for p in (cut / "models").iterdir()}

    calls.clear()
    stop[0] = None
    r = _report(cli, fx, cut, fx["sp"], fx["base"])
    assert r.returncode == 0, r.stderr
    assert calls == [("base", 16), ("base", 32)]  # only the pairs not done
    assert "2 of 4 model-context pairs already done" in r.stderr
    for p in files_under(whole):
        if p.suffix == ".csv":
            assert (cut / p.name).read_text() == p.read_text(), p.name

    calls.clear()  # another list of contexts: only the new T is computed, the others are read back
    r = _report(cli, fx, cut, fx["sp"], fx["base"], ctx=("8", "16", "32"))
    assert r.returncode == 0, r.stderr
    assert calls == [("sp", 8), ("base", 8)] and "4 of 6 model-context pairs already done" in r.stderr
    assert all((cut / "models" / n).stat().st_mtime_ns == t for n, t in done.items())
    summary = pd.read_csv(cut / "report_summary.csv")
    assert list(summary["ctx"]) == [8, 16, 32, 8, 16, 32]
    before = pd.read_csv(whole / "report_ctx_layers.csv")
    after = pd.read_csv(cut / "report_ctx_layers.csv")
    pd.testing.assert_frame_equal(after[after["ctx"] != 8].reset_index(drop=True), before)
    assert json.loads((cut / "manifest.json").read_text())["contexts"] == [8, 16, 32]

    # a one-context run on a sweep's folder, and a sweep on a one-context folder: other settings, one line
    assert_one_line_error(_report(cli, fx, cut, fx["sp"], ctx=("16",)), "other settings", "ctx: 'sweep' (now 16)")
    one = tmp_path / "one"
    assert _report(cli, fx, one, fx["sp"], ctx=("16",)).returncode == 0
    assert_one_line_error(_report(cli, fx, one, fx["sp"]), "other settings", "ctx: 16 (now 'sweep')")


def test_sweep_shards_merged_equal_the_unsharded_sweep(cli, fx, tmp_path):
    models = (fx["sp"], fx["llama"], fx["base"])
    whole, s1, s2, merged = (tmp_path / n for n in ("whole", "s1", "s2", "merged"))
    assert _report(cli, fx, whole, *models).returncode == 0
    r = _report(cli, fx, s1, *models, extra=("--shard", "1/2"))
    assert r.returncode == 0, r.stderr
    assert len(list((s1 / "models").iterdir())) == 2 * 2  # models 1 and 3, both contexts
    assert _report(cli, fx, s2, *models, extra=("--shard", "2/2")).returncode == 0

    r = cli("report", "--merge", s2, s1, "--out", merged)
    assert r.returncode == 0, r.stderr
    assert "sink report: 3 models" in r.stdout and "contexts 16 32" in r.stdout
    csvs = sorted(p.name for p in whole.glob("*.csv"))
    assert set(CTX_CSVS) <= set(csvs) and sorted(p.name for p in merged.glob("*.csv")) == csvs
    for name in csvs:
        assert (merged / name).read_text() == (whole / name).read_text(), name
    page, page_whole = ((d / "report.html").read_text() for d in (merged, whole))
    assert PLOTLY_ID.sub("ID", page) == PLOTLY_ID.sub("ID", page_whole)
    assert json.loads((merged / "manifest.json").read_text())["contexts"] == [16, 32]
    r = _report(cli, fx, merged, *models)  # the merged folder is a whole report over the same contexts
    assert r.returncode == 0 and "6 of 6 model-context pairs already done" in r.stderr

    out = tmp_path / "out"
    other = tmp_path / "other"  # shard 2/2 of the same models over other contexts: another run
    assert _report(cli, fx, other, *models, ctx=("8", "16"), extra=("--shard", "2/2")).returncode == 0
    r = cli("report", "--merge", s1, other, "--out", out)
    assert_one_line_error(r, "different runs", "--ctx 16 32", "--ctx 8 16")
    cut = tmp_path / "cut"  # a shard killed after some of its pairs: not finished
    cut.mkdir()
    for p in files_under(s1):
        if p.is_file():
            (cut / p.relative_to(s1)).parent.mkdir(parents=True, exist_ok=True)
            (cut / p.relative_to(s1)).write_bytes(p.read_bytes())
    next(p for p in (cut / "models").iterdir() if "ctx_32" in p.name).unlink()
    assert_one_line_error(cli("report", "--merge", cut, s2, "--out", out), "not finished", "3 of 4 model-context pairs")
    assert files_under(out) == []


def test_sweep_conflicts_are_one_line_errors_that_write_nothing(cli, fx, tmp_path):
    out = tmp_path / "out"
    r = _report(cli, fx, out, fx["sp"], extra=("--protocol", "gu2025"))
    assert_one_line_error(r, "--ctx 16 32 conflicts with --protocol gu2025", "first 64 tokens")
    r = cli("report", "--models", fx["sp"], "--data", "synthetic:random[T=16]", *WINDOWS, "--ctx", "16", "32")
    assert_one_line_error(r, "--ctx 16 32 does not apply to --data 'synthetic:random[T=16]'")
    r = _report(cli, fx, out, fx["sp"], fx["base"], ctx=("16", "100"))  # beyond the tiny models' 64
    assert_one_line_error(r, "--ctx 100 exceeds the maximum context 64")
    assert files_under(out) == []
    r = cli("report", "--models", fx["sp"], "--ctx", "16", "x")
    assert r.returncode == 2 and "--ctx" in r.stderr


def test_checkpoints_over_contexts(cli, fx, tmp_path):
    """--checkpoints RUN --ctx T1 T2: every snapshot at every T, with its training step in every table."""
    import shutil

    run = tmp_path / "run"
    for step, model in ((0, "sp"), (2, "base")):  # two snapshots of a training run's layout
        shutil.copytree(fx[model], run / "snapshots" / f"step{step}")
    out = tmp_path / "o"
    r = cli("report", "--checkpoints", run, "--data", fx["data"], *WINDOWS, "--ctx", "16", "32", "--out", out)
    assert r.returncode == 0, r.stderr
    for name in ("report_summary.csv", "report_ctx_summary.csv"):
        table = pd.read_csv(out / name)
        assert list(zip(table["step"], table["ctx"])) == [(0, 16), (0, 32), (2, 16), (2, 32)], name
        assert list(table["model"].unique()) == [f"{run}@step0", f"{run}@step2"]
    assert (out / "report.html").read_text().count("Plotly.newPlot") == 2


def test_sweep_tables_name_each_contexts_own_corpus(cli, tmp_path):
    """A Bigram-Backcopy chain's label carries its T: each (model, T) row of the sweep's tables names the windows it
    was measured on, as the per-(model, T) tables and `probe sinks --ctx` do (before: the last context's label on
    every row, T=32 beside ctx 16)."""
    out = tmp_path / "bb"
    r = cli("report", "--models", "probe/bb-baseline", *WINDOWS, "--ctx", "16", "32", "--out", out, "--quiet")
    assert r.returncode == 0, r.stderr
    per_pair = pd.read_csv(out / "report_summary.csv").set_index("ctx")["corpus"]
    assert [per_pair[t].endswith(f"T={t}]") for t in (16, 32)] == [True, True]
    for name in CTX_CSVS:
        table = pd.read_csv(out / name)
        assert list(table["corpus"]) == list(table["ctx"].map(per_pair)), name
