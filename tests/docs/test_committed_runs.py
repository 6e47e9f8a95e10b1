"""Tables of runs committed for the site's figures (docs/data/, drawn at build by ``<!-- figure of ... -->``) agree
with what they stand for: the sink-emergence trajectory's step-1200 rows are the shipped zoo models, so they must
equal the statistics each zoo.json records (which tests/cli/test_bb_cli.py reproduces from the weights); it holds
every column the recipe's trajectory figure draws, for both layers at every step."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
TRAJECTORY = ROOT / "docs" / "data" / "sink_emergence_trajectory.csv"


def test_the_trajectory_is_drawn_on_the_sink_emergence_page():
    page = (ROOT / "docs" / "how-to" / "sink-emergence.md").read_text(encoding="utf-8")
    assert (
        '<!-- figure of "docs/data/sink_emergence_trajectory.csv" by '
        "probe.experiments.sink_emergence.trajectory_figure -->" in page
    )


@pytest.mark.parametrize("variant", ["baseline", "sinklogit"])
def test_the_trajectory_ends_at_the_zoo_models_recorded_statistics(variant):
    from probe.experiments.sink_emergence import SENSITIVITY, TRAJECTORIES

    table = pd.read_csv(TRAJECTORY)
    runs = table[table["variant"] == variant]
    assert sorted(runs["step"].unique()) == [0, 200, 400, 1200]
    assert runs.groupby("step")["layer"].apply(sorted).tolist() == [[0, 1]] * 4
    # the committed trajectory predates the sensitivity columns (the figure draws what a table has)
    assert {col for col, _, _ in TRAJECTORIES if col not in SENSITIVITY} <= set(table.columns)
    zoo = json.loads((ROOT / "probe" / "zoo" / f"bb-{variant}" / "zoo.json").read_text(encoding="utf-8"))
    last = runs[runs["step"] == zoo["step"]].set_index("layer")
    for layer in zoo["stats"]["layers"]:
        row = last.loc[layer["layer"]]
        for col in ("pos0_share", "uniform_ref", "r0", "phantom_share"):
            assert row[col] == pytest.approx(layer[col], abs=2e-6), (variant, layer["layer"], col)
    summary = zoo["stats"]["summary"]
    assert bool(last["sink_formed"].iloc[0]) == summary["sink_formed"]
    assert last["pos0_over_uniform"].iloc[0] == pytest.approx(summary["pos0_over_uniform"], abs=2e-6)
