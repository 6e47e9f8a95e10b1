"""`probe report --checkpoints RUN --sensitivity`: each training snapshot's sensitivity of the last token to each
position (docs/definitions.md#sensitivity), read from the snapshot folders, equals the Frobenius norms of the full
Jacobian taken by hand on the report's first batch of windows; the flags' bad values are one line."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

import probe
from probe.jobs.inputs import WindowCache, tokenizer_for
from probe.jobs.specs import WindowSpec
from tests.support.analyses import full_jacobian_norms
from tests.support.cli import WINDOWS, assert_one_line_error


def test_report_over_checkpoints_carries_each_snapshots_sensitivity(fx, tmp_path, cli):
    run, data = tmp_path / "run", ["--data", fx["data"]]
    train = ["train", "--variant", "baseline", "--tier", "tiny", *data, "--eval-data", fx["data"], "--eval-batches"]
    r = cli(*train, "1", "--steps", "2", "--batch-size", "2", "--ctx", "32", "--snapshot-every", "2", "--out", run)
    assert r.returncode == 0, r.stderr
    r = cli(
        "report", "--checkpoints", run, "--sensitivity", "exact", *data, *WINDOWS, "--quiet", "--out", tmp_path / "r"
    )
    assert r.returncode == 0, r.stderr
    assert "mixing" in r.stdout  # the terminal's sink-mechanism columns
    summary = pd.read_csv(tmp_path / "r" / "report_sensitivity.csv")
    positions = pd.read_csv(tmp_path / "r" / "report_sensitivity_positions.csv")
    assert sorted(summary["step"]) == [0, 2]
    spec = WindowSpec(data=str(fx["data"]), batches=1, batch_size=2, ctx=32)
    for step in (0, 2):
        model = probe.load(f"{run}@step{step}")
        ids = WindowCache(spec).get(model, tokenizer_for(spec, model), 32).tokens[0, :, :-1]  # (2, 32)
        last = model.probe_info.n_layers - 1
        by_hand = torch.stack([full_jacobian_norms(model, ids[b : b + 1], last) for b in range(2)]).double()  # (2, T)
        share = by_hand / by_hand.sum(-1, keepdim=True)
        mine = positions[positions["step"] == step]
        assert list(mine["layer"].unique()) == [last] and list(mine["position"]) == list(range(32))
        assert mine["sensitivity"].to_numpy() == pytest.approx(by_hand.mean(0).numpy(), rel=1e-4)
        assert mine["share"].to_numpy() == pytest.approx(share.mean(0).numpy(), rel=1e-4)
        row = summary[summary["step"] == step].iloc[0]
        assert row["first_share"] == pytest.approx(float(share[:, 0].mean()), rel=1e-4)
        assert row["mixing"] == pytest.approx(float(share[:, 1:-1].sum(-1).mean()), rel=1e-4)
    assert summary.loc[0, "mixing"] != summary.loc[1, "mixing"]  # the two snapshots' weights differ
    assert "Over-mixing" in (tmp_path / "r" / "report.html").read_text()


@pytest.mark.parametrize(
    "flags, needles",
    [
        (["--sensitivity", "approx"], ["'approx'", "exact", "sampled"]),
        (["--sensitivity", "--sensitivity-samples", "1"], ["--sensitivity-samples 1", "at least 2"]),
        # without --sensitivity the samples were ignored (no sensitivity table, exit 0); a sampled-method option
        (["--sensitivity-samples", "8"], ["--sensitivity-samples 8 needs --sensitivity sampled", "without"]),
        # the exact method takes no directions: 8 was ignored and 1 an internal error (exit 1)
        (["--sensitivity", "exact", "--sensitivity-samples", "8"], ["needs --sensitivity sampled", "exact"]),
        (["--sensitivity", "exact", "--sensitivity-samples", "1"], ["--sensitivity-samples 1 needs", "exact"]),
    ],
)
def test_bad_sensitivity_flags_are_one_line(fx, tmp_path, cli, flags, needles):
    r = cli("report", "--models", fx["sp"], *flags, "--data", fx["data"], *WINDOWS, "--out", tmp_path / "r")
    assert_one_line_error(r, *needles)
    assert not (tmp_path / "r").exists()
