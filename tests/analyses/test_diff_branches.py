"""Differential attention's two branches in the sink tables (docs/definitions.md#signed-rows): on a tiny probe diff
model the streamed per-branch statistics (``pos0_share_1`` / ``_2`` of ``sink_stats``, ``key0_mass_1`` / ``_2`` and
``sink_share_1`` / ``_2`` of Sink^ε) equal the softmax statistics computed by hand from ``hook_pattern_1`` /
``hook_pattern_2``; a model of any other rule has none of these columns; ``probe sinks`` on probe/bb-diff prints
them."""

from __future__ import annotations

import subprocess

import pytest
import torch

from probe.analyses.capture import as_windows
from probe.analyses.inject import exposure_stats, quiet_mask
from probe.analyses.sink_heads import BRANCH_EPS_COLUMNS, sink_heads
from probe.analyses.sinks import BRANCH_COLUMNS, sink_stats
from probe.cli import main
from probe.hooks import names
from probe.models import create
from tests.support import SMALL
from tests.support.analyses import tiny, windows

CFG = {k: v for k, v in dict(SMALL, vocab_size=53).items() if k != "n_heads"}  # as tests/models/test_diff.py
EPS = 0.15  # between the tiny model's branch key-0 masses, so both sides of the threshold are met


@pytest.fixture(scope="module")
def diff():
    model = create("diff", seed=0, **CFG).eval()
    data = windows(2, 2, 12, vocab=53)
    return model, data, branch_key0_by_hand(model, data)


def branch_key0_by_hand(model, data) -> torch.Tensor:
    """(2, L, H, B·N, T) key 0's share of each branch's softmax row, read off hook_pattern_1 / hook_pattern_2."""
    w, info = as_windows(data), model.probe_info
    wanted = {names.attn(l, f"pattern_{b}") for l in info.attention_layers for b in (1, 2)}
    per_batch = []
    with torch.no_grad():
        for n in range(len(w)):
            _, cache = model.run_with_cache(w.inputs(n), names_filter=lambda h: h in wanted)
            per_batch.append(
                torch.stack(
                    [
                        torch.stack(
                            [  # (B, H, T) -> (H, B, T)
                                (p := cache[names.attn(l, f"pattern_{b}")].double())[..., 0]
                                .div(p.sum(-1))
                                .transpose(0, 1)
                                for l in info.attention_layers
                            ]
                        )
                        for b in (1, 2)
                    ]
                )
            )
    return torch.cat(per_batch, dim=3)  # batches of equal size: a row mean over them is the pooled mean


def test_sink_stats_per_branch_shares_are_the_branches_softmax_shares(diff):
    model, data, key0 = diff  # key0 (2, L, H, rows, T)
    heads = sink_stats(model, data)["heads"].sort_values(["layer", "head"])
    for b, col in enumerate(BRANCH_COLUMNS):
        want = key0[b][..., 1:].mean((-2, -1)).flatten()  # rows t >= 1, per (layer, head)
        got = torch.tensor(heads[col].to_numpy())
        assert torch.allclose(got, want, atol=1e-6, rtol=0), (col, (got - want).abs().max())
    # the net row's share is not either branch's (the difference moves it)
    assert not torch.allclose(torch.tensor(heads["pos0_share"].to_numpy()), key0[0][..., 1:].mean((-2, -1)).flatten())


def test_sink_eps_per_branch_is_the_branches_key0_mass_thresholded(diff):
    model, data, key0 = diff
    found = sink_heads(model, data, eps=EPS)
    heads = found["heads"].sort_values(["layer", "head"])
    layers, summary = found["layers"].sort_values("layer"), found["summary"]
    for b in (1, 2):
        alpha = key0[b - 1][..., 1:].mean((-2, -1))  # (L, H) the branch's key-0 mass over rows t >= 1
        got = torch.tensor(heads[f"key0_mass_{b}"].to_numpy())
        assert torch.allclose(got, alpha.flatten(), atol=1e-6, rtol=0)
        share = (alpha > EPS).double().mean(-1)  # (L,)
        assert torch.equal(torch.tensor(layers[f"sink_share_{b}"].to_numpy()), share)
        assert summary[f"sink_share_{b}"].iloc[0] == pytest.approx(float(share.mean()), abs=1e-12)
        assert summary[f"key0_mass_{b}"].iloc[0] == pytest.approx(float(alpha.mean()), abs=1e-6)
    assert 0 < float((key0[..., 1:].mean((-2, -1)) > EPS).double().mean()) < 1  # EPS splits the heads


def test_other_models_have_no_branch_columns():
    model, data = tiny("sinklogit"), windows(1, 2, 8)
    sinks, eps = sink_stats(model, data), sink_heads(model, data)
    for table in sinks.values():
        assert not set(BRANCH_COLUMNS) & set(getattr(table, "columns", ()))
    for table in eps.values():
        columns = set(getattr(table, "columns", ()))
        assert not set(BRANCH_EPS_COLUMNS) & columns and not {"key0_mass_1_key0", "key0_mass_2_key0"} & columns


def test_probe_sinks_on_bb_diff_prints_each_branch(capsys):
    args = ["sinks", "--model", "probe/bb-diff", "--ctx", "32", "--batches", "1", "--batch-size", "2"]
    code = main([*args, "--threads", "1"])
    r = subprocess.CompletedProcess(args, code, *capsys.readouterr())
    assert r.returncode == 0, r.stderr
    body, terms = r.stdout.split("\nterms:\n")
    summary = {ln.split()[0]: float(ln.split()[1]) for ln in body.splitlines() if ln.startswith("  pos0_share")}
    assert set(summary) == {"pos0_share", *BRANCH_COLUMNS} and all(0 <= v <= 1 for v in summary.values())
    layer_header = next(ln for ln in body.splitlines() if ln.split()[:2] == ["layer", "layer_type"])
    eps_header = next(ln for ln in body.splitlines() if ln.split()[:1] == ["epsilon"])
    assert set(BRANCH_COLUMNS) <= set(layer_header.split()) and set(BRANCH_EPS_COLUMNS) <= set(eps_header.split())
    for term in ("pos0_share_1", "pos0_share_2", "sink_share_1", "key0_mass_1"):
        assert f"  {term}:" in terms


def test_exposure_per_branch_is_each_branchs_mass_on_the_quiet_reads(diff):
    """quiet_share_1 / _2 (probe inject's exposure) = Σ_j p_b,tj over the reads below the q25 norm cutoff, rows
    t >= 1; the clean pass's sink summary carries each branch's pos0_share as sink_stats does."""
    model, data, key0 = diff
    found = exposure_stats(model, data, cutoffs=["q25"])
    heads = found["exposure_heads"].sort_values(["layer", "head"])
    w, info = as_windows(data), model.probe_info
    G, shares = info.kv_group, {1: [], 2: []}
    with torch.no_grad():
        for n in range(len(w)):
            _, cache = model.run_with_cache(
                w.inputs(n), names_filter=lambda h: names.is_attn(h, "pattern_1", "pattern_2", "v")
            )
            for b in (1, 2):
                per_layer = []
                for l in info.attention_layers:
                    norms = cache[names.attn(l, "v")].double().norm(dim=-1)  # (B, T, Hkv)
                    quiet = quiet_mask(norms, 0.25).permute(0, 2, 1).repeat_interleave(G, 1).double()  # (B, H, T)
                    p = cache[names.attn(l, f"pattern_{b}")].double()  # (B, H, T, T)
                    per_layer.append((p * quiet[:, :, None, :]).sum(-1)[:, :, 1:].sum((0, 2)))  # (H,)
                shares[b].append(torch.stack(per_layer))  # (L, H)
    rows = data.shape[0] * data.shape[1] * (data.shape[2] - 2)  # windows x rows t >= 1 (inputs are T = ctx)
    for b in (1, 2):
        want = (sum(shares[b]) / rows).flatten()
        assert torch.allclose(torch.tensor(heads[f"quiet_share_{b}"].to_numpy()), want, atol=1e-6, rtol=0)
        want_pos0 = key0[b - 1][..., 1:].mean((-2, -1)).mean()
        assert found["sinks"][f"pos0_share_{b}"].iloc[0] == pytest.approx(float(want_pos0), abs=1e-6)
