"""The Bigram-Backcopy ablation rows of docs/reference/analyses.md (section "Ablations") rerun from the shipped weights
with the command that page gives, in this process (``probe.cli.main``), and compared row by row."""

import json
import re
from pathlib import Path

import pytest

from probe.cli import main

PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "analyses.md"
COMMAND = [
    "ablate",
    "--batches",
    "4",
    "--batch-size",
    "8",
    "--ablate",
    "knockout",
    "value",
    "evict",
    "--value",
    "zero",
    "mean",
    "swap",
    "--keep",
    "0",
    "1",
    "4",
    "--window",
    "16",
    "--threads",
    "1",
    "--quiet",
    "--json",
]


def page_rows() -> dict[tuple, tuple]:
    """{(model, 'intervention setting', layer): (clean loss, delta, delta s.e.)} from the page's table."""
    text = PAGE.read_text(encoding="utf-8")
    table = text.split("<!-- ablate bb table -->", 1)[1].split("<!-- end of ablate bb table -->", 1)[0]
    rows = {}
    for line in table.strip().splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        delta, se = re.match(r"([+-][\d.]+) ± ([\d.]+)", cells[4]).groups()
        rows[(cells[0].strip("`"), cells[1], cells[2])] = (float(cells[3]), float(delta), float(se))
    return rows


def test_the_page_command_is_the_one_this_test_runs():
    text = " ".join(PAGE.read_text(encoding="utf-8").split())
    assert "probe ablate --model probe/bb-baseline " + " ".join(COMMAND[1:-2]) in text


@pytest.mark.parametrize("model", ["probe/bb-baseline", "probe/bb-sinklogit"])
def test_bigram_backcopy_ablation_rows_reproduce(model, capsys):
    want = {k: v for k, v in page_rows().items() if k[0] == model}
    assert len(want) == 15  # knockout, three value ablations (every layer and each of 2 layers), 3 evictions
    assert main(["ablate", "--model", model, *COMMAND[1:]]) == 0
    doc = json.loads(capsys.readouterr().out)
    got = {}
    for r in doc["tables"]["results"]:
        layer = "all" if r["layer"] == -1 else str(r["layer"])
        got[(model, f"{r['intervention']} {r['setting']}", layer)] = (r["loss_clean"], r["delta"], r["delta_se"])
    assert sorted(got) == sorted(want)
    for key, (clean, delta, se) in want.items():
        assert got[key][0] == pytest.approx(clean, abs=6e-5), key  # printed to 4 decimals
        assert got[key][1] == pytest.approx(delta, abs=2e-6), key  # printed to 6 decimals
        assert got[key][2] == pytest.approx(se, abs=2e-6), key
