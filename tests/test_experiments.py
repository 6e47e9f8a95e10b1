"""The paper recipes (probe.experiments): each at toy size end to end, plus the checks the issue asks for."""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from probe import experiments
from probe.experiments import superposition as sp


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# ---------------------------------------------------------------- registry and command line
def test_registry_lists_every_recipe_with_a_description():
    assert set(experiments.REGISTRY) == set(experiments.RECIPES)
    for name, desc in experiments.RECIPES.items():
        assert desc and "\n" not in desc
        mod = experiments.module(name)
        assert callable(mod.run) and hasattr(mod, "CONFIG")
    with pytest.raises(ValueError, match="did you mean 'superposition'"):
        experiments.module("superpositon")
    with pytest.raises(ValueError, match="no option"):
        experiments.make_config("superposition", stepz=3)


def test_main_writes_config_tables_and_figures(tmp_path, capsys):
    from probe.experiments.__main__ import main

    out = tmp_path / "sp"
    rc = main(["superposition", "--out", str(out), "--quiet", "--steps", "3", "--loads", "1", "--seeds", "0",
               "--n-eval", "64", "--keys", "blind", "--batch-size", "16"])
    assert rc == 0
    record = json.loads((out / "config.json").read_text())
    assert record["recipe"] == "superposition" and record["config"]["steps"] == 3
    assert record["config"]["loads"] == [1] and record["meta"]["wall_s"] >= 0
    for t in record["tables"]:
        assert (out / f"{t}.csv").exists()
    summary = pd.read_csv(out / "summary.csv")
    assert set(summary["variant"]) == set(sp.VARIANTS)
    assert (out / "error_vs_load.html").exists() and (out / "report.html").stat().st_size > 100_000
    assert not list(out.glob(".*.tmp"))
    # user errors: one line, exit 2, nothing written
    assert main(["superposition", "--out", str(tmp_path / "bad"), "--loads", "x"]) == 2
    assert main(["nope", "--out", str(tmp_path / "bad")]) == 2
    assert main(["superposition", "--out", str(tmp_path / "bad"), "--variants", "gate"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and "unknown variants" in err[-1]
    assert not (tmp_path / "bad").exists()


# ---------------------------------------------------------------- superposition task
def test_dictionary_orthonormal_up_to_d_then_unit():
    f = sp.dictionary(64, 64, 0)
    assert torch.allclose(f @ f.T, torch.eye(64), atol=1e-5)
    f = sp.dictionary(32, 64, 1)
    assert torch.allclose(f @ f.T, torch.eye(32), atol=1e-5)
    f = sp.dictionary(256, 64, 0)
    assert torch.allclose(f.norm(dim=1), torch.ones(256), atol=1e-5)
    assert (f @ f.T - torch.eye(256)).abs().max() > 0.2  # superposed: features interfere


def test_sample_targets_are_presence_of_relevant_features():
    cfg = sp.SuperpositionConfig()
    feats = sp.dictionary(128, 64, 0)
    x, tags, rel, y = sp.sample(feats, cfg, 512, torch.Generator().manual_seed(0), torch.Generator().manual_seed(1))
    assert x.shape == (512, 64, 64) and tags.shape == x.shape and y.shape == (512, 16)
    assert abs(rel.float().mean().item() - 0.15) < 0.01
    ids = (x @ feats.T).argmax(-1)  # recover the feature of each item
    assert torch.equal(ids < 16, rel)
    for b in range(0, 512, 37):
        present = set(ids[b][rel[b]].tolist())
        assert set(torch.nonzero(y[b]).flatten().tolist()) == present
    # the items do not depend on whether tags are drawn (blind and visible conditions see the same items)
    x2, none, _, _ = sp.sample(feats, cfg, 512, torch.Generator().manual_seed(0))
    assert none is None and torch.equal(x, x2)


def _train_params(cfg, variants, seeds, steps=5):
    import torch.nn.functional as F

    dicts = [sp.dictionary(128, cfg.d, s) for s in seeds]
    model = sp.StackedHeads(cfg, variants, seeds)
    sp.set_initial_tau(model, dicts, cfg, seeds)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    gens = [sp._gen("train", s, 2) for s in seeds]
    tags = [sp._gen("tags", s, 2) for s in seeds]
    for _ in range(steps):
        x, k, rel, y = sp._batch(dicts, cfg, 32, gens, tags, "blind")
        logits, _ = model(x, k, rel)
        loss = F.binary_cross_entropy_with_logits(logits, y[:, None].expand_as(logits), reduction="none")
        opt.zero_grad()
        loss.mean((-2, -1)).sum().backward()
        opt.step()
    return model


def test_stacked_models_train_exactly_like_separate_runs():
    cfg = sp.SuperpositionConfig(d_head=16)
    both = _train_params(cfg, ["baseline", "normgate", "oracle"], [0, 1])
    alone = _train_params(cfg, ["normgate"], [1])
    for name in ("q", "w_k", "w_v", "w_r", "b_r", "tau"):
        a, b = getattr(both, name)[1, 1], getattr(alone, name)[0, 0]
        assert torch.allclose(a, b, atol=1e-5), name
    # paired: every variant of a seed starts from the same weights
    fresh = sp.StackedHeads(cfg, ["baseline", "offbyone", "normgate"], [3])
    assert torch.equal(fresh.w_v[0, 0], fresh.w_v[0, 2]) and torch.equal(fresh.q[0, 0], fresh.q[0, 1])


def test_oracle_and_phantom_semantics():
    cfg = sp.SuperpositionConfig(d_head=16)
    model = sp.StackedHeads(cfg, ["baseline", "offbyone", "oracle"], [0])
    feats = sp.dictionary(128, 64, 0)
    x, tags, rel, _ = sp.sample(feats, cfg, 8, torch.Generator().manual_seed(0), torch.Generator().manual_seed(1))
    _, diag = model(x[None], tags[None], rel[None])
    a = diag["attn"][0]
    assert torch.allclose(a[0].sum(-1), torch.ones(8), atol=1e-5)  # baseline rows sum to 1
    assert (a[1].sum(-1) < 1).all()  # off-by-one leaves mass on the phantom
    # the oracle's output ignores irrelevant items: changing them does not change its logits
    x2 = torch.where(rel[..., None], x, torch.randn_like(x))
    l1, _ = model(x[None], tags[None], rel[None])
    l2, _ = model(x2[None], tags[None], rel[None])
    assert torch.allclose(l1[0, 2], l2[0, 2], atol=1e-5) and not torch.allclose(l1[0, 0], l2[0, 0], atol=1e-3)


def test_superposition_reproduces_the_qualitative_result():
    """Reduced schedule (200 steps x 128 sequences at lr 1e-2, one seed) instead of 4000 x 256 at 1e-3."""
    cfg = sp.SuperpositionConfig(steps=200, batch_size=128, lr=1e-2, seeds=(0,), loads=(1, 8), n_eval=1024,
                                 curve_every=0)
    res = sp.run(cfg)
    s = res["summary"].set_index(["keys", "load", "variant"])["error"]
    blind_room = s["blind", 8, "baseline"] - s["blind", 8, "oracle"]
    gate_gain = s["blind", 8, "baseline"] - s["blind", 8, "normgate"]
    assert blind_room > 0.05  # superposition leaves filtering headroom when routing is blind
    assert gate_gain > 0.25 * blind_room  # the norm gate closes part of it...
    assert gate_gain - (s["blind", 1, "baseline"] - s["blind", 1, "normgate"]) > 0.05  # ...more as load grows
    assert abs(s["blind", 8, "baseline"] - s["blind", 8, "offbyone"]) < 0.25 * blind_room  # abstention does not
    assert abs(s["visible", 8, "baseline"] - s["visible", 8, "oracle"]) < 0.5 * blind_room  # visible: no headroom
    assert all(sp.qualitative_checks(res).values())
    gap = res["gap"].set_index(["keys", "load"])
    assert gap.at[("blind", 8), "normgate_closed_error"] == pytest.approx(gate_gain / blind_room)
    # routing sees content only with visible keys
    m = res["summary"].set_index(["keys", "load", "variant"])["mass_relevant"]
    assert m["visible", 8, "baseline"] > 0.8 and abs(m["blind", 8, "baseline"] - 0.15) < 0.05


def test_superposition_gate_without_sharpness_gives_no_filter():
    """A control that the check above can fail: with beta = 0 the 'gate' is the constant 1/2, so it must not
    beat the baseline."""
    cfg = sp.SuperpositionConfig(steps=200, batch_size=128, lr=1e-2, seeds=(0,), loads=(8,), n_eval=1024,
                                 keys=("blind",), variants=("baseline", "normgate", "oracle"), beta=0.0,
                                 curve_every=0)
    s = sp.run(cfg)["summary"].set_index("variant")["error"]
    room = s["baseline"] - s["oracle"]
    assert room > 0.05 and s["baseline"] - s["normgate"] < 0.25 * room
