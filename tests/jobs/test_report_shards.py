"""`probe report --shard i/N` and `--merge`: shards of one run joined equal the unsharded report; bad shards and
foreign or missing shard folders are one-line errors that write nothing. In-process CLI calls (one import)."""

from __future__ import annotations

import json
import re
import shutil

import pandas as pd
import pytest

from probe.errors import UsageError
from probe.jobs.report import shard_share
from probe.jobs.shards import parse_shard
from tests.support.cli import WINDOWS, assert_one_line_error, files_under

PLOTLY_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")  # plotly's random div ids


def _report(cli, fx, out, *extra, models=("sp", "llama", "base")):
    return cli(
        "report",
        "--models",
        *(fx[m] for m in models),
        "--data",
        fx["data"],
        *WINDOWS,
        "--inject-doses",
        "0.4",
        "--out",
        out,
        *extra,
    )


def test_parse_shard_and_share():
    assert parse_shard("2/4") == (2, 4) and parse_shard("1/1") == (1, 1)
    for bad in ("0/2", "3/2", "x/y", "1/0", "2", "-1/2", ""):
        with pytest.raises(UsageError, match="expected i/N with 1 <= i <= N"):
            parse_shard(bad)
    names = list("abcde")
    shares = [shard_share(names, (i, 3)) for i in (1, 2, 3)]
    assert shares == [["a", "d"], ["b", "e"], ["c"]]  # round-robin: each model in exactly one shard
    assert shard_share(names, None) == names and shard_share(names, (3, 4)) == ["c"] and shard_share([], (1, 2)) == []


def test_two_shards_merged_equal_the_unsharded_report(cli, fx, tmp_path):
    whole, s1, s2, merged = (tmp_path / n for n in ("whole", "s1", "s2", "merged"))
    r = _report(cli, fx, whole)
    assert r.returncode == 0, r.stderr
    r = _report(cli, fx, s1, "--shard", "1/2")
    assert r.returncode == 0, r.stderr
    assert "shard 1/2, 2 of 3 models" in r.stdout
    r = _report(cli, fx, s2, "--shard", "2/2")
    assert r.returncode == 0, r.stderr
    names = [str(fx[m]) for m in ("sp", "llama", "base")]
    m1, m2 = (json.loads((s / "manifest.json").read_text()) for s in (s1, s2))
    assert m1["models"] == m2["models"] == names  # each shard records its run ...
    assert m1["shard"] == {"index": 1, "count": 2, "models": [names[0], names[2]]}  # ... and which shard it is
    assert m2["shard"] == {"index": 2, "count": 2, "models": [names[1]]}
    assert len(list((s2 / "models").iterdir())) == 1

    r = _report(cli, fx, s1, "--shard", "1/2")  # a finished shard resumes without recomputing
    assert r.returncode == 0 and "2 of 2 models already done" in r.stderr
    assert_one_line_error(_report(cli, fx, s1, "--shard", "2/2"), "holds shard 1/2 of a report, not shard 2/2")

    r = cli("report", "--merge", s2, s1, "--out", merged)  # any order on the command line
    assert r.returncode == 0, r.stderr
    assert "sink report: 3 models" in r.stdout
    csvs = sorted(p.name for p in whole.glob("*.csv"))
    assert len(csvs) == 10 and sorted(p.name for p in merged.glob("*.csv")) == csvs  # incl. per-batch rows
    for name in csvs:
        assert (merged / name).read_text() == (whole / name).read_text(), name
    page, page_whole = ((d / "report.html").read_text() for d in (merged, whole))
    assert page != page_whole and len(PLOTLY_ID.findall(page)) > 0  # the ids differ, nothing else does
    assert PLOTLY_ID.sub("ID", page) == PLOTLY_ID.sub("ID", page_whole)
    manifest = json.loads((merged / "manifest.json").read_text())
    assert manifest["models"] == names and [s["shard"] for s in manifest["merged_from"]] == ["1/2", "2/2"]

    r = _report(cli, fx, merged)  # the merged folder is a whole report: an unsharded run finds every model done
    assert r.returncode == 0 and "3 of 3 models already done" in r.stderr

    # errors: one line, exit 2, nothing written to --out
    out = tmp_path / "out"
    for flag in ("0/2", "3/2", "x/y"):
        assert_one_line_error(_report(cli, fx, out, "--shard", flag), f"--shard {flag!r}", "1 <= i <= N")
    assert_one_line_error(cli("report", "--merge", s1, "--out", out), "missing shard 2/2", "given: 1/2")
    assert_one_line_error(cli("report", "--merge", s1, s1, "--out", out), "shard 1/2 given twice")
    assert_one_line_error(cli("report", "--merge", s1, whole, "--out", out), "different splits", "shard 1/1")
    assert_one_line_error(cli("report", "--merge", s1, s2, "--out", s1), "is one of the --merge folders")
    assert_one_line_error(cli("report", "--merge", s1, fx["sp"], "--out", out), "not a probe report folder")
    assert_one_line_error(cli("report", "--merge", s1, s2, "--models", fx["sp"], "--out", out), "--merge")
    seed1 = tmp_path / "seed1"  # shard 2/2 of the same models with another seed: another run
    assert _report(cli, fx, seed1, "--shard", "2/2", "--seed", "1").returncode == 0
    assert_one_line_error(cli("report", "--merge", s1, seed1, "--out", out), "different runs", "seed: 0", "1 in")
    fewer = tmp_path / "fewer"  # shard 2/2 of another model list (its share is the same model)
    assert _report(cli, fx, fewer, "--shard", "2/2", models=("sp", "llama")).returncode == 0
    assert_one_line_error(cli("report", "--merge", s1, fewer, "--out", out), "model lists differ at model 3")
    cut = tmp_path / "cut"  # a shard killed after its first model: not finished
    shutil.copytree(s1, cut)
    next(p for p in (cut / "models").iterdir() if "base" in p.name).unlink()
    assert_one_line_error(cli("report", "--merge", cut, s2, "--out", out), "shard 1/2", "not finished", "1 of 2")
    assert files_under(out) == []


def test_more_shards_than_models(cli, fx, tmp_path):
    """A job array larger than the sweep: the extra shard writes only its manifest, and the merge still works."""
    runs = [tmp_path / f"s{i}" for i in (1, 2, 3)]
    for i, folder in enumerate(runs, start=1):
        r = _report(cli, fx, folder, "--shard", f"{i}/3", models=("sp", "base"))
        assert r.returncode == 0, r.stderr
    assert "shard 3/3, 0 of 2 models" in r.stdout
    assert [p.name for p in files_under(runs[2])] == ["manifest.json", "models"]
    r = cli("report", "--merge", *runs, "--out", tmp_path / "merged")
    assert r.returncode == 0, r.stderr
    summary = pd.read_csv(tmp_path / "merged" / "report_summary.csv")
    assert list(summary["model"]) == [str(fx["sp"]), str(fx["base"])]
