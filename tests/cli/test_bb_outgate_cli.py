"""The zoo's G1 models on the command line, offline: ``probe gates`` (output-gate statistics) and ``probe ablate
--ablate gate`` run on probe/bb-outgate and probe/bb-outgate-head with their own Bigram-Backcopy chain, and the gate
clamps do what they should (closed: no attention output, so the back-copy is lost; open: the ungated output, nearly
the trained model element-wise, far off headwise, whose nearly closed gate the model is trained around).
test_bb_cli.py reproduces their recorded sink statistics like every shipped BB model's."""

import json
import subprocess

import pandas as pd
import pytest

from probe.cli import main
from probe.runs import ZOO_DIR

G1 = ["bb-outgate", "bb-outgate-head"]


def cli(capsys, *args) -> subprocess.CompletedProcess:
    code = main([str(a) for a in args])
    return subprocess.CompletedProcess(list(args), code, *capsys.readouterr())


@pytest.mark.parametrize("name", G1)
def test_the_zoo_has_the_g1_models(name):
    rec = json.loads((ZOO_DIR / name / "zoo.json").read_text())
    assert rec["variant"] == name.removeprefix("bb-") and rec["step"] == rec["recipe"]["steps"]


@pytest.mark.parametrize("name", G1)
def test_gates_and_gate_clamps_on_a_shipped_g1_model(name, capsys, tmp_path):
    r = cli(capsys, "gates", "--model", f"probe/{name}", "--threads", "1", "--out", tmp_path / "g", "--quiet")
    assert r.returncode == 0, r.stderr
    summary = (tmp_path / "g" / "gates_summary.csv").read_text().splitlines()
    assert "mean_gate" in summary[0] and len(summary) == 2
    r = cli(capsys, "ablate", "--model", f"probe/{name}", "--ablate", "gate", "--threads", "1", "--out", tmp_path / "a")
    assert r.returncode == 0, r.stderr
    results = pd.read_csv(tmp_path / "a" / "ablate_results.csv")
    whole = results[results["scope"] == "model"].set_index("setting")["delta"]
    assert set(whole.index) == {"open", "closed", "mean"}
    assert whole["closed"] > 0.1 and whole["closed"] > whole["mean"] > 0  # no attention output: the back-copy is lost
    if name == "bb-outgate":  # element-wise, mean gate about 0.4: the ungated output is nearly the trained model
        assert abs(whole["open"]) < 0.01
    else:  # headwise, mean gate about 0.1: the trained model relies on the scale-down, and opening it overshoots
        assert whole["open"] > whole["closed"]
