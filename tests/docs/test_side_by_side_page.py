"""benchmarks/side_by_side.py: probe, TransformerLens's bridge and nnsight give the same answers to its three
questions on a tiny gpt2, a disagreement fails the run, its CSV has its columns, and the page shows the script's
snippets as they stand."""

from __future__ import annotations

import pandas as pd
import pytest

pytest.importorskip("transformer_lens")
pytest.importorskip("nnsight")

from benchmarks import side_by_side as bench  # noqa: E402

T = 32


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    from probe.checkpoints.tiny import build_tiny
    from tests.support.side_by_side import _quiet

    folder = build_tiny("gpt2", tmp_path_factory.mktemp("side") / "gpt2", seed=3, positions=T + 8)
    out = []
    with _quiet():
        for tool in bench.TOOLS:
            out += bench.sweep(tool, folder, "gpt2", T, T + 8, cap_s=60.0, cap_gb=1.0)
    return out


def test_the_three_tools_agree(rows):
    diffs = bench.agree(rows)
    assert sorted(diffs) == [("gpt2", q, T) for q in sorted(bench.QUESTIONS)]
    for r in rows:
        if r["question"] == "share":
            assert len(r["answer"]) == 2 and all(0 < s < 1 for s in r["answer"])  # two layers, shares of rows
        else:
            assert abs(r["answer"]) > 1e-6, r  # the edit moved the loss: a hook that did nothing would agree too
    assert max(diffs.values()) <= bench.LOSS_TOL


def test_a_disagreement_fails_the_run(rows):
    moved = [dict(r) for r in rows]
    knocked = next(r for r in moved if r["tool"] == "nnsight" and r["question"] == "knockout")
    knocked["answer"] += 10 * bench.LOSS_TOL
    with pytest.raises(AssertionError, match="the tools differ"):
        bench.agree(moved)


def test_the_csv_and_the_figure(rows, tmp_path):
    result = {"rows": rows, "agreement": bench.agree(rows), "hooks": {}, "skipped": {}}
    doc = bench.write_data(result, {"settings": {"ctx": T}}, tmp_path)
    table = pd.read_csv(tmp_path / "side_by_side.csv")
    assert list(table.columns) == bench.COLUMNS
    assert len(table) == len(bench.TOOLS) * len(bench.QUESTIONS)
    assert set(table["stopped"]) == {"max-ctx"}  # T + 8 < 2T: the one context
    assert doc["lines"]["probe"]["share"] == 1  # sink_stats(...)["layers"]["pos0_share"].tolist(): one line
    assert len(bench.figure(table).data) == 2 * len(bench.TOOLS)  # time and memory, one line per tool each


def test_the_page_shows_the_snippets_as_they_stand():
    if not bench.PAGE.is_file():
        pytest.skip("docs/results/side-by-side.md is written by python benchmarks/side_by_side.py")
    text = bench.PAGE.read_text(encoding="utf-8")
    stale = [f"{t} {q}" for t in bench.TOOLS for q in bench.QUESTIONS if bench.snippet_source(t, q) not in text]
    assert not stale, f"the page's snippets differ from the script's: {stale}; rerun with --page-only"
