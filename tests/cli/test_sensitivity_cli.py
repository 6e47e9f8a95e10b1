"""`probe sensitivity` end to end on a zoo model, in process: the tables it writes are the analyses' own, its bad
collapse length is one line naming the longest valid one."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

import probe
from probe.analyses.collapse import collapse
from probe.cli.main import main

ARGS = ["sensitivity", "--model", "probe/tiny-baseline", "--batches", "1", "--batch-size", "2", "--ctx", "8"]


def test_the_verb_writes_the_analyses_tables(tmp_path, capsys):
    torch.set_num_threads(1)
    out = tmp_path / "out"
    args = [*ARGS, "--method", "sampled", "--samples", "4", "--collapse", "2", "6", "--collapse-ids", "5", "7"]
    assert main([*args, "--quiet", "--out", str(out)]) == 0
    assert "verdict:" in capsys.readouterr().out
    doc = json.loads((out / "sensitivity.json").read_text())
    positions = pd.read_csv(out / "sensitivity_positions.csv")
    assert len(positions) == 8 and positions["share"].sum() == pytest.approx(1.0, abs=1e-9)
    assert (positions["estimator_rse"] > 0).all()  # sampled: each position has its error
    got = pd.read_csv(out / "sensitivity_collapse_lengths.csv")
    want = collapse(probe.load("probe/tiny-baseline"), [2, 6], 5, 7)["lengths"]
    assert got["distance"].to_numpy() == pytest.approx(want["distance"].to_numpy(), rel=1e-12)
    assert doc["tables"]["collapse_summary"][0]["dtype"] == "float32"


def test_a_collapse_length_past_the_context_is_one_line(capsys):
    assert main([*ARGS, "--quiet", "--collapse", "256"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["probe sensitivity: error: --collapse 256: lengths up to 255 (the model's context - 1)"]
