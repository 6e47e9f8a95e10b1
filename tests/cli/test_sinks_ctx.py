"""`probe sinks --ctx T1 T2 ...`: the sink analyses at several context lengths in one run, reported against T
(probe.analyses.context_sweep, probe.present.sinks_ctx); one --ctx stays the single-context run."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from tests.support.cli import probe

MODEL = "probe/tiny-sink+proj"
WINDOWS = ["--batches", "1", "--batch-size", "2"]


def test_several_contexts_in_one_run(tmp_path):
    out = tmp_path / "sweep"
    r = probe("sinks", "--model", MODEL, *WINDOWS, "--ctx", "32", "16", "--massive", "--out", out)
    assert r.returncode == 0, r.stderr
    assert "T = 16 → 32" in r.stdout
    summary = pd.read_csv(out / "sinks_ctx_summary.csv")
    layers = pd.read_csv(out / "sinks_ctx_layers.csv")
    assert summary["ctx"].tolist() == [16, 32]  # ascending, whatever the order given
    assert set(layers["ctx"]) == {16, 32} and layers["massive_top1"].notna().all()
    assert {"pos0_share", "uniform_ref", "r0", "sink_share"} <= set(layers.columns)
    assert not (out / "sinks_summary.csv").exists() and not (out / "sinks.html").exists()
    page = (out / "sinks_ctx.html").read_text()
    assert "against context length" in page
    # each context's numbers are the single-context run's
    one = probe("sinks", "--model", MODEL, *WINDOWS, "--ctx", "16", "--out", tmp_path / "one")
    assert one.returncode == 0, one.stderr
    single = pd.read_csv(tmp_path / "one" / "sinks_summary.csv").iloc[0]
    row = summary.set_index("ctx").loc[16]
    for col in ("pos0_share", "uniform_ref", "r0"):
        assert row[col] == pytest.approx(single[col], abs=1e-9)
    assert row["corpus"] == single["corpus"]
    assert not (tmp_path / "one" / "sinks_ctx_summary.csv").exists()  # one --ctx: today's files only
    meta = json.loads((out / "sinks_ctx.json").read_text())["meta"]
    assert meta["ctx"] == "16 32"


def test_each_contexts_rows_name_its_own_windows(tmp_path):
    """A synthetic corpus's label carries T: the rows of T = 32 said T=16 (the first context's windows)."""
    out = tmp_path / "sweep"
    r = probe("sinks", "--model", "probe/bb-diff", *WINDOWS, "--ctx", "16", "32", "--quiet", "--out", out)
    assert r.returncode == 0, r.stderr
    for table in ("summary", "layers", "by_type"):
        corpora = pd.read_csv(out / f"sinks_ctx_{table}.csv").groupby("ctx")["corpus"].unique()
        assert [list(c) for c in corpora] == [[c[0]] for c in corpora]  # one label per context
        assert "T=16" in corpora[16][0] and "T=32" in corpora[32][0], table
    meta = json.loads((out / "sinks_ctx.json").read_text())["meta"]
    assert "T=16" in meta["corpus"] and "T=32" in meta["corpus"]


def test_several_contexts_refuse_dormant_in_one_line():
    r = probe("sinks", "--model", MODEL, *WINDOWS, "--ctx", "16", "32", "--dormant")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].count("--dormant") >= 1 and "16 32" in r.stderr


@torch.no_grad()
def test_sweep_tables_per_layer_type_on_a_sliding_model(tmp_path):
    """On a model with sliding and full layers (tiny Gemma 3: window 4) the sweep reports both types at every T, and
    each context's per-layer numbers are those of sink_analyses at that T."""
    import probe as probe_pkg
    from probe.analyses.context_sweep import sink_context_sweep
    from probe.analyses.sink_pass import sink_analyses
    from probe.checkpoints.tiny import build_tiny

    model = probe_pkg.load(str(build_tiny("gemma3_text", tmp_path / "g3")))
    g = torch.Generator().manual_seed(0)
    windows = {t: torch.randint(2, 96, (1, 2, t + 1), generator=g) for t in (8, 32)}
    sweep, per_ctx = sink_context_sweep(model, windows, eps=[0.3], massive=True)
    by_type = sweep["by_type"]
    assert set(zip(by_type["ctx"], by_type["layer_type"])) == {
        (8, "sliding"),
        (8, "full"),
        (32, "sliding"),
        (32, "full"),
    }
    assert by_type.set_index(["ctx", "layer_type"])["layers"].to_dict()[(32, "sliding")] == 2
    alone = sink_analyses(model, windows[32], eps=[0.3])["sinks"]["layers"]
    got = sweep["layers"][sweep["layers"]["ctx"] == 32]
    torch.testing.assert_close(torch.tensor(got["pos0_share"].to_numpy()), torch.tensor(alone["pos0_share"].to_numpy()))
    # the causal-uniform reference falls with T in full layers
    full = by_type[by_type["layer_type"] == "full"].set_index("ctx")["uniform_ref"]
    assert full[32] < full[8]


@torch.no_grad()
def test_a_differential_models_sweep_carries_each_branch_as_its_single_context_run():
    """DIFF's tables at one context have each branch's key-0 share, Sink^ε share and key-0 mass beside the net row's;
    the sweep carries them at every T, equal to a separate single-context run's."""
    import probe as probe_pkg
    from probe.analyses.context_sweep import sink_context_sweep
    from probe.analyses.sink_pass import sink_analyses

    model = probe_pkg.load("probe/bb-diff")
    g = torch.Generator().manual_seed(1)
    windows = {t: torch.randint(0, 64, (1, 2, t + 1), generator=g) for t in (16, 32)}
    sweep, _ = sink_context_sweep(model, windows, eps=[0.3])
    for t in windows:
        alone = sink_analyses(model, windows[t], eps=[0.3])
        layers = sweep["layers"][sweep["layers"]["ctx"] == t].set_index("layer")
        summary = sweep["summary"].set_index("ctx").loc[t]
        row_mass = alone["sinks"]["layers"].set_index("layer")["row_mass"]  # the signed rows' mass, 1 - λ
        assert layers["row_mass"].to_numpy() == pytest.approx(row_mass.to_numpy(), abs=1e-12)
        assert summary["row_mass"] == pytest.approx(alone["sinks"]["summary"]["row_mass"].iloc[0])
        for b in ("_1", "_2"):
            for col, table in (
                (f"pos0_share{b}", "sinks"),
                (f"sink_share{b}", "sink_eps"),
                (f"key0_mass{b}", "sink_eps"),
            ):
                want = alone[table]["layers"].set_index("layer")[col]
                assert layers[col].to_numpy() == pytest.approx(want.to_numpy(), abs=1e-12), (t, col)
            assert summary[f"pos0_share{b}"] == pytest.approx(alone["sinks"]["summary"][f"pos0_share{b}"].iloc[0])
            assert summary[f"sink_share{b}"] == pytest.approx(alone["sink_eps"]["summary"][f"sink_share{b}"].iloc[0])
        by_type = sweep["by_type"].set_index("ctx").loc[t]
        assert by_type["pos0_share_1"] == pytest.approx(layers["pos0_share_1"].mean())
