"""The CLI on one model_type per adapter family of the coverage table: one ``probe report`` (sinks, Sink^eps, massive
activations) over a tiny checkpoint of each, in one process, writes every table for every model; ``probe
models --architectures`` prints the table's counts."""

from __future__ import annotations

import csv
import json
import math

from probe.checkpoints import architectures
from probe.checkpoints.tiny import build_tiny
from tests.support.cli import probe


def one_type_per_adapter() -> list[str]:
    """The first model_type of each adapter, but emu3: its tiny model is Emu3's text part, whose saved folder
    transformers' AutoModelForCausalLM does not read back (a released Emu3 folder is the multimodal model)."""
    chosen: dict[str, str] = {}
    for model_type, r in sorted(architectures.table()["types"].items()):
        if r["status"] in ("supported", "partial") and model_type != "emu3":
            chosen.setdefault(r["adapter"], model_type)
    return sorted(chosen.values())


def test_probe_report_runs_on_one_type_per_adapter_family(tmp_path):
    types = one_type_per_adapter()
    assert len(types) >= 30  # every adapter family of the table
    dirs = [build_tiny(mt, tmp_path / mt) for mt in types]
    words = tmp_path / "words.txt"  # text in the tiny vocabulary (w2 ... w95), one document
    words.write_text(" ".join(f"w{2 + (7 * i) % 94}" for i in range(200)) + "\n")
    out = tmp_path / "out"
    r = probe(
        "report", "--models", *dirs, "--data", words, "--batches", "1", "--batch-size", "2", "--ctx", "16",
        "--massive", "--json", "--quiet", "--out", out,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    summary = {row["model"]: row for row in json.loads(r.stdout)["summary"]}
    assert sorted(summary) == sorted(map(str, dirs))
    assert all(0 < row["pos0_share"] < 1 and math.isfinite(row["r0"]) for row in summary.values())
    for table in ("report_layers.csv", "report_sink_eps.csv", "report_massive.csv"):
        with open(out / table) as f:
            assert {row["model"] for row in csv.DictReader(f)} == set(summary), table


def test_probe_models_architectures_prints_the_counts():
    r = probe("models", "--architectures")
    assert r.returncode == 0, r.stderr
    c = architectures.table()["counts"]
    assert f"{c['supported']} supported, {c['partial']} partial, {c['refused']} refused" in r.stdout
