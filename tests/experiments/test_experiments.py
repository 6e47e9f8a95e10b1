"""The paper recipes (probe.experiments): each at toy size end to end, plus the checks the issue asks for."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from probe import experiments
from probe.experiments import superposition as sp
from probe.writes import TEMP_PREFIX


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
    from probe.experiments.command import main

    out = tmp_path / "sp"
    rc = main(
        [
            "superposition",
            "--out",
            str(out),
            "--quiet",
            "--steps",
            "3",
            "--loads",
            "1",
            "--seeds",
            "0",
            "--n-eval",
            "64",
            "--keys",
            "blind",
            "--batch-size",
            "16",
        ]
    )
    assert rc == 0
    record = json.loads((out / "config.json").read_text())
    assert record["recipe"] == "superposition" and record["config"]["steps"] == 3
    assert record["config"]["loads"] == [1] and record["meta"]["wall_s"] >= 0
    for t in record["tables"]:
        assert (out / f"{t}.csv").exists()
    summary = pd.read_csv(out / "summary.csv")
    assert set(summary["variant"]) == set(sp.VARIANTS)
    report = (out / "report.html").read_text()  # tables, then figures loading the folder's plotly.min.js
    assert (out / "error_vs_load.html").exists() and "Plotly.newPlot" in report and "src='plotly.min.js'" in report
    assert (out / "plotly.min.js").is_file() and "report.html" in (out / "index.html").read_text()
    assert not list(out.rglob(f"{TEMP_PREFIX}*"))  # every staged file was renamed into place
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
    cfg = sp.SuperpositionConfig(
        steps=200, batch_size=128, lr=1e-2, seeds=(0,), loads=(1, 8), n_eval=1024, curve_every=0
    )
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
    cfg = sp.SuperpositionConfig(
        steps=200,
        batch_size=128,
        lr=1e-2,
        seeds=(0,),
        loads=(8,),
        n_eval=1024,
        keys=("blind",),
        variants=("baseline", "normgate", "oracle"),
        beta=0.0,
        curve_every=0,
    )
    s = sp.run(cfg)["summary"].set_index("variant")["error"]
    room = s["baseline"] - s["oracle"]
    assert room > 0.05 and s["baseline"] - s["normgate"] < 0.25 * room


# ---------------------------------------------------------------- trained recipes at toy size
@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """Options for a toy paired-training run: a small text file as training and evaluation corpus, a 2-layer
    32-wide model, 3 steps."""
    from probe.data import load_corpus

    path = tmp_path_factory.mktemp("corpus") / "toy.txt"
    docs = load_corpus("wikitext-2-valid").documents[:6]
    path.write_text("\n\n".join(d.replace("\n\n", "\n") for d in docs))
    return dict(
        data=str(path),
        eval_corpus=str(path),
        eval_mode="random",
        eval_batches=2,
        eval_batch_size=2,
        ctx=32,
        batch_size=2,
        steps=3,
        n_layers=2,
        d_model=32,
        n_heads=2,
        d_mlp=64,
        warmup=1,
    )


def _losses(rows):
    return pd.DataFrame(rows, columns=["variant", "seed", "loss"])


def test_decomposition_tables_on_hand_made_losses():
    from probe.experiments.decomposition import table8, tables_from_losses

    base = [3.00, 3.10, 3.20]
    imp = {
        "sinklogit": [0.010, 0.012, 0.014],
        "normgate": [0.005, 0.007, 0.003],
        "sink+norm": [0.014, 0.016, 0.018],
        "projgate": [0.020, 0.020, 0.020],
        "sink+proj": [0.030, 0.026, 0.028],
        "routing-normgate": [-0.001, 0.002, 0.0],
    }
    rows = [("baseline", s, b) for s, b in enumerate(base)]
    rows += [(v, s, b - d) for v, ds in imp.items() for s, (b, d) in enumerate(zip(base, ds))]
    t = tables_from_losses(_losses(rows))
    se = 0.002 / math.sqrt(3)  # sample SD of (x-0.002, x, x+0.002) is 0.002; of (x, x+0.006, x+0.006) 0.002·√3
    t2 = t["table2"].set_index(["gate_form", "quantity"])
    expect = {
        ("norm", "sink"): (0.012, se),
        ("norm", "gate"): (0.005, se),
        ("norm", "both"): (0.016, se),
        ("norm", "overlap"): (0.001, se),
        ("norm", "filter"): (0.004, 0.0),
        ("norm", "share"): (0.25, None),
        ("proj", "gate"): (0.020, 0.0),
        ("proj", "both"): (0.028, se),
        ("proj", "overlap"): (0.004, 0.002),
        ("proj", "filter"): (0.016, 0.002),
        ("proj", "share"): (0.016 / 0.028, None),
    }
    for key, (mean, s) in expect.items():
        assert t2.at[key, "mean"] == pytest.approx(mean, abs=1e-9), key
        if s is not None:
            assert t2.at[key, "se"] == pytest.approx(s, abs=1e-9), key
    t1 = t["table1"].set_index(["block", "variant"])
    assert t1.at[("over baseline", "sink+norm"), "mean"] == pytest.approx(0.016)
    assert t1.at[("over baseline", "routing-normgate"), "n_improved"] == 1
    lower = t1.loc["filtering increment (over sinklogit)"]
    assert list(lower.index) == ["sink+norm", "sink+proj"]
    assert lower.at["sink+norm", "mean"] == pytest.approx(0.004) and lower.at["sink+norm", "n_improved"] == 3
    gates = pd.DataFrame(
        {
            "variant": ["routing-normgate"] * 3,
            "seed": [0, 1, 2],
            "read_mean_gate": [0.9, 0.95, 1.0],
            "frac_below_half": [0.03, 0.0, 0.03],
        }
    )
    t8 = table8(_losses(rows), gates).iloc[0]
    assert t8["improvement"] == pytest.approx(0.001 / 3) and t8["n_improved"] == 1
    assert t8["read_mean_gate"] == pytest.approx(0.95) and t8["frac_below_half"] == pytest.approx(0.02)
    # a table without the combined variants still gives Table 1 (and an empty Table 2)
    part = tables_from_losses(_losses([r for r in rows if r[0] in ("baseline", "normgate")]))
    assert len(part["table1"]) == 1 and part["table2"].empty


def test_decomposition_end_to_end_toy(toy, tmp_path):
    res = experiments.run("decomposition", out=tmp_path / "dec", seeds=(0, 1), **toy)
    runs = res["runs"]
    assert len(runs) == 7 * 2 and runs["val_loss"].map(math.isfinite).all()
    assert runs.groupby("seed")["val_loss"].nunique().min() > 1  # the variants differ
    t1, t2 = res["table1"], res["table2"]
    assert set(t2["gate_form"]) == {"norm", "proj"}
    for form, both in (("norm", "sink+norm"), ("proj", "sink+proj")):
        q = t2[t2["gate_form"] == form].set_index("quantity")["mean"]
        assert q["overlap"] == pytest.approx(q["sink"] + q["gate"] - q["both"])
        inc = t1[(t1["block"].str.startswith("filtering")) & (t1["variant"] == both)]["mean"].iloc[0]
        assert q["filter"] == pytest.approx(inc)  # both - sink, paired per seed, = the filtering increment
        assert q["share"] == pytest.approx(q["filter"] / q["both"])
    t8 = res["table8"].iloc[0]
    assert 0 < t8["read_mean_gate"] < 1 and 0 <= t8["frac_below_half"] <= 1
    assert set(res["gates"]["variant"]) == {"normgate", "projgate", "sink+norm", "sink+proj", "routing-normgate"}
    assert (tmp_path / "dec" / "table2.csv").exists() and (tmp_path / "dec" / "table2_norm.html").exists()


def test_a_paired_work_folder_resumes_its_own_runs_and_refuses_other_settings(toy, tmp_path):
    """A rerun into the same --work reloads its finished runs (the same numbers, nothing trained); one with another
    corpus or learning rate used to reload them too and report the old models under the new settings. It is a
    one-line error naming what differs, as is a run folder written before the record was kept."""
    from probe.experiments.paired import RUN_RECORD

    work = tmp_path / "work"
    kw = dict(variants=("baseline",), seeds=(0,), work=str(work), **toy)
    first = experiments.run("depth-routing", out=tmp_path / "a", **kw)["runs"]
    again = experiments.run("depth-routing", out=tmp_path / "b", **kw)["runs"]
    assert again["val_loss"].tolist() == first["val_loss"].tolist()
    with pytest.raises(ValueError, match=r"seed0 holds a run trained with other settings \(different train\)"):
        experiments.run("depth-routing", out=tmp_path / "c", **{**kw, "lr": 0.01})
    other = tmp_path / "other.txt"
    other.write_text(Path(toy["data"]).read_text()[::-1])
    with pytest.raises(ValueError, match=r"\(different corpus\)"):
        experiments.run("depth-routing", out=tmp_path / "d", **{**kw, "data": str(other)})
    (work / "baseline" / "seed0" / RUN_RECORD).unlink()
    with pytest.raises(ValueError, match="holds a run without a record of its settings"):
        experiments.run("depth-routing", out=tmp_path / "e", **kw)


# ---------------------------------------------------------------- GatedV controls
def _v_out_moments(model, windows):
    acc = {}

    def hook(v, hook):
        acc.setdefault(int(hook.name.split(".")[1]), []).append(v.detach().double().flatten())

    with torch.no_grad():
        model.run_with_hooks(windows, fwd_hooks=[(lambda n: n.endswith("hook_v_out"), hook)])
    return {l: (torch.cat(x).mean().item(), torch.cat(x).std().item()) for l, x in sorted(acc.items())}


def test_moment_matched_silu_reproduces_baseline_initial_value_moments(toy):
    from probe.experiments import gatedv_controls as G
    from probe.experiments.paired import Data, TrainSpec
    from probe.models import create

    spec = TrainSpec(**{**toy, "n_layers": 4, "d_model": 64, "n_heads": 2, "d_mlp": 128})
    data = Data(spec)
    windows = G.calibration_windows(data, spec, 0, 128)
    base = create("baseline", spec.tier, seed=0, n_layers=4, d_model=64, n_heads=2, d_mlp=128)
    target = _v_out_moments(base, windows)  # baseline: aggregated value = hook_v
    mm, moments = G.build_control(spec, data, "mm-silu", 0, 128)
    got = _v_out_moments(mm, windows)
    assert len(got) == 4
    for l, (mu, sd) in target.items():
        assert moments.at[l, "mu_v"] == pytest.approx(mu, abs=1e-6) and moments.at[l, "sd_v"] == pytest.approx(
            sd, rel=1e-3
        )
        tol = (1e-5, 1e-4) if l == 0 else (0.05, 0.03)  # layer 0 sees the same input; later ones nearly so
        assert abs(got[l][0] - mu) < tol[0] * sd and abs(got[l][1] / sd - 1) < tol[1], (l, got[l], (mu, sd))
    plain = _v_out_moments(create("gatedv", spec.tier, seed=0, n_layers=4, d_model=64, n_heads=2, d_mlp=128), windows)
    assert abs(plain[0][0] - target[0][0]) > 0.1 and abs(plain[0][1] / target[0][1] - 1) > 0.2  # SiLU alone differs
    am, _ = G.build_control(spec, data, "affine-match", 0, 128)  # the reverse: linear values at SiLU's moments
    a0 = _v_out_moments(am, windows)[0]
    assert a0[0] == pytest.approx(moments.at[0, "mu_phi"], abs=1e-4) and a0[1] == pytest.approx(
        moments.at[0, "sd_phi"], rel=1e-3
    )


def test_value_affine_hooks_stay_through_training_and_analyses(toy, tmp_path):
    from probe.experiments import gatedv_controls as G
    from probe.experiments.paired import Data, TrainSpec, train_config
    from probe.models import create
    from probe.train.trainer import train

    spec = TrainSpec(**toy)
    data = Data(spec)
    ov = dict(n_layers=2, d_model=32, n_heads=2, d_mlp=64)
    model, _ = G.build_control(spec, data, "mm-silu", 0, 8)
    twin = create("gatedv", seed=0, **ov)
    ids = data.eval.tokens[0, :, :-1]
    assert not torch.allclose(model(ids).logits, twin(ids).logits)
    train(model, data.sampler(spec, 0), train_config(spec, 0), tmp_path / "run", progress=False)
    model.run_with_hooks(ids, fwd_hooks=[("blocks.0.attn.hook_v", lambda t, hook: None)])  # resets its own hooks
    twin.load_state_dict(model.state_dict())
    assert not torch.allclose(model(ids).logits, twin(ids).logits)  # the affine maps are still applied
    # ... and sit in the autograd graph: the gradient of W_V differs from the unhooked twin's at the same weights
    grads = []
    for m in (model, twin):
        m.zero_grad()
        m(ids).logits.logsumexp(-1).mean().backward()
        grads.append(m.blocks[1].attn.v_proj.weight.grad.clone())
    assert grads[0].abs().sum() > 0 and not torch.allclose(grads[0], grads[1], rtol=1e-3, atol=1e-7)


def test_gatedv_controls_end_to_end_toy(toy, tmp_path):
    res = experiments.run(
        "gatedv-controls", out=tmp_path / "gv", seeds=(0, 1), calib_windows=8, bootstrap_resamples=100, **toy
    )
    ppl = res["ppl"].set_index("variant")
    assert set(ppl.index) == {"baseline", "gatedv", "affine-match", "mm-silu", "gatedv-q", "gatedv-qkv"}
    assert ppl.at["baseline", "delta_vs_baseline_pct"] == 0 and ppl.at["gatedv", "delta_vs_gatedv_pct"] == 0
    assert ppl.at["mm-silu", "ppl_mean"] == pytest.approx(
        float(np.exp(res["runs"].query("variant == 'mm-silu'")["val_loss"]).mean())
    )
    m = res["moments"]
    assert len(m) == 2 * 2 * 2  # control x seed x layer
    assert (m["sd_phi"] < m["sd_v"]).all()  # SiLU shrinks the spread of unit-scale values
    b = res["bootstrap"].set_index("variant")
    assert (b["lo"] <= b["mean"]).all() and (b["mean"] <= b["hi"]).all()


# ---------------------------------------------------------------- value swap (Table 9)
def test_value_swap_equals_the_other_variant_with_the_same_weights():
    from probe.experiments.value_swap import with_value_gate
    from probe.models import create

    ov = dict(n_layers=2, d_model=32, n_heads=2, d_mlp=64)
    base, gv = create("baseline", seed=3, **ov), create("gatedv", seed=3, **ov)
    ids = torch.randint(0, 8192, (2, 16))
    assert torch.allclose(with_value_gate(base, "silu")(ids).logits, gv(ids).logits, atol=1e-6)
    assert torch.allclose(with_value_gate(gv, "none")(ids).logits, base(ids).logits, atol=1e-6)
    assert not torch.allclose(base(ids).logits, gv(ids).logits, atol=1e-3)
    with pytest.raises(ValueError, match="value swap"):
        with_value_gate(create("normgate", **ov), "silu")


def test_value_swap_end_to_end_toy(toy, tmp_path):
    res = experiments.run("value-swap", out=tmp_path / "vs", seeds=(0, 1), **toy)
    t = res["table9"]
    assert len(t) == 4 and set(t["n"]) == {2}
    pm = res["per_model"]
    own = pm[(pm["training"] == pm["inference"])].set_index(["model", "seed"])["loss"]
    runs = res["runs"].set_index(["variant", "seed"])["val_loss"]
    for (m, s), loss in own.items():  # evaluating with the trained activation reproduces the training recipe's loss
        assert loss == pytest.approx(runs[(m, s)], abs=1e-5)


# ---------------------------------------------------------------- depth routing
def test_depth_routing_end_to_end_toy(toy, tmp_path):
    variants = ("baseline", "attnres-full", "slr-full-r8", "plr-full-r8", "attnres-block2")
    res = experiments.run("depth-routing", out=tmp_path / "dr", variants=variants, seeds=(0, 1), **toy)
    s = res["summary"].set_index("variant")
    routed = [v for v in variants if v != "baseline"]
    assert (s.loc[routed, "S_src"] == s.loc[routed, "S_src_cost_model"]).all()
    assert s.at["attnres-full", "S_src"] == 2 + 3 + 4 + 5  # 2L = 4 sub-layers: sites with 2..5 sources
    assert s.at["slr-full-r8", "rank"] == 8 and s.at["attnres-block2", "blocks"] == 2
    assert s["grad_norm_mean"].gt(0).all() and s["grad_norm_mean_se"].notna().all()
    g = res["grad_norm"]
    assert len(g) == len(variants) * 2 * toy["steps"]
    assert s.at["baseline", "grad_norm_mean"] == pytest.approx(g[g.variant == "baseline"]["grad_norm"].mean())
    heat = res["heatmap"].groupby(["variant", "seed", "site"])["alpha"].sum()
    assert np.allclose(heat.to_numpy(), 1.0, atol=1e-5)
    sites = res["sites"]
    assert (sites["neff_mean"] <= sites["n_sources"] + 1e-6).all() and (sites["neff_mean"] >= 1 - 1e-6).all()
    assert {"neff_sites", "neff_rank_sweep", "heatmaps", "grad_norm"} <= set(res.figures)


def _nearest_permutation_by_hand(res: torch.Tensor) -> torch.Tensor:
    """min over all n! permutation matrices P of ‖res − P‖_F, per matrix: (N, n, n) -> (N,)."""
    import itertools

    n = res.shape[-1]
    perms = torch.stack([torch.eye(n, dtype=torch.float64)[list(p)] for p in itertools.permutations(range(n))])
    return torch.linalg.matrix_norm(res[:, None].double() - perms).amin(-1)


def test_depth_routing_stream_columns_match_the_weights_by_hand():
    from probe.experiments.depth_routing_streams import stream_tables
    from probe.hooks import names
    from probe.models import create

    arch = dict(n_layers=2, d_model=32, n_heads=2, d_mlp=64)
    models = {(v, 0): create(v, "tiny", seed=0, **arch).eval() for v in ("baseline", "hc", "mhc")}
    g = torch.Generator().manual_seed(0)
    static = []  # hc's H_res per connection, moved off the identity (at init it is I: both distances 0)
    for block in models[("hc", 0)].blocks:
        for conn in (block.hc_attn, block.hc_mlp):
            with torch.no_grad():
                conn.static_res += 0.3 * torch.randn(conn.static_res.shape, generator=g)
            static.append(conn.static_res.detach().double())
    windows = torch.randint(0, models[("hc", 0)].config.vocab_size, (2, 2, 17), generator=g)
    runs, sites = stream_tables(models, windows)
    assert set(runs["variant"]) == {"hc", "mhc"}  # the baseline has no streams
    hc = sites[sites["variant"] == "hc"].set_index("site_index")
    for k, res in enumerate(static):  # static mixing: every token's H_res is the parameter
        eye = torch.eye(res.shape[0], dtype=torch.float64)
        assert hc.at[k, "identity_distance"] == pytest.approx(float(torch.linalg.matrix_norm(res - eye)), rel=1e-6)
        assert hc.at[k, "identity_distance_max"] == pytest.approx(hc.at[k, "identity_distance"], rel=1e-6)
        assert hc.at[k, "permutation_distance"] == pytest.approx(float(_nearest_permutation_by_hand(res[None])[0]))
    run = runs.set_index("variant")
    connections = hc[hc["sublayer"] != "head"]
    assert (connections["usage_entropy"] == 0).all()  # H_pre is still one-hot: one stream read alone
    assert run.at["mhc", "usage_entropy_nats"] == pytest.approx(run.at["mhc", "usage_entropy"] * np.log(4))
    mhc_model, hooked = models[("mhc", 0)], []
    for layer in range(2):
        hooked += [names.hc(layer, site, "res") for site in names.HC_SITES]
    _, cache = mhc_model.run_with_cache(windows.flatten(0, 1)[:, :-1], names_filter=hooked)
    mhc = sites[sites["variant"] == "mhc"].set_index("site_index")
    for k, name in enumerate(hooked):
        res = cache[name].double().flatten(0, 1)  # B·T, n, n: out x in, the token's own mixing
        assert torch.allclose(res.sum(-1), torch.ones(()).double(), atol=1e-5)  # doubly stochastic: rows
        assert torch.allclose(res.sum(-2), torch.ones(()).double(), atol=1e-4)  # and columns (Sinkhorn)
        by_hand = _nearest_permutation_by_hand(res)
        assert mhc.at[k, "permutation_distance"] == pytest.approx(float(by_hand.mean()), rel=1e-9)
        assert mhc.at[k, "permutation_distance_max"] == pytest.approx(float(by_hand.max()), rel=1e-9)
    assert run.at["mhc", "permutation_distance"] == pytest.approx(mhc["permutation_distance"].mean())


def test_depth_routing_stream_columns_end_to_end_toy(toy, tmp_path):
    variants = ("baseline", "hc", "mhc", "attnres-full")
    res = experiments.run("depth-routing", out=tmp_path / "dr", variants=variants, seeds=(0, 1), **toy)
    s = res["summary"].set_index("variant")
    stream_cols = ["identity_distance", "permutation_distance", "usage_entropy", "usage_entropy_nats", "bos_ratio"]
    assert s.loc[["baseline", "attnres-full"], stream_cols].isna().all().all()
    assert s.loc[["hc", "mhc"], ["neff_mean", "S_src"]].isna().all().all()  # and the depth sources' vice versa
    assert s.loc[["hc", "mhc"], stream_cols + [f"{c}_se" for c in stream_cols]].notna().all().all()
    assert s.loc["attnres-full", ["neff_mean", "S_src"]].notna().all()
    streams = res["streams"]
    assert sorted(zip(streams["variant"], streams["seed"])) == [("hc", 0), ("hc", 1), ("mhc", 0), ("mhc", 1)]
    mean = streams.groupby("variant")[stream_cols].mean()
    assert np.allclose(s.loc[["hc", "mhc"], stream_cols].to_numpy(), mean.loc[["hc", "mhc"]].to_numpy())
    assert len(s.at["hc", "bos_layer_stream"].split()) == 2 and pd.isna(s.at["baseline", "bos_layer_stream"])
    sites = res["stream_sites"]
    hc = sites[sites["variant"] == "hc"]  # static mixing: the same distance for every token
    assert np.allclose(hc["identity_distance"], hc["identity_distance_max"], equal_nan=True)
    connections = sites.dropna(subset=["permutation_distance"])
    assert len(connections) == 2 * 2 * 2 * toy["n_layers"]  # runs x connections (the final read mixes no streams)
    assert (connections["permutation_distance"] <= connections["permutation_distance_max"] + 1e-12).all()
    assert "stream_identity" in res.figures
    assert (tmp_path / "dr" / "streams.csv").is_file() and (tmp_path / "dr" / "stream_sites.csv").is_file()


# ---------------------------------------------------------------- cross-layer diagnostics
def test_adjacent_cosine_matches_hidden_states(tmp_path):
    from transformers import AutoModelForCausalLM

    import probe
    from probe.checkpoints.tiny import build_tiny
    from probe.experiments.cross_layer import adjacent_cosine

    d = build_tiny("gpt_neox", tmp_path / "neox")
    model = probe.load(str(d))
    ref = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    ids = torch.randint(0, ref.config.vocab_size, (2, 12))
    got = adjacent_cosine(model, torch.cat([ids, ids[:, :1]], -1))  # windows of T+1: the model reads the first T
    with torch.no_grad():
        hs = ref(ids, output_hidden_states=True).hidden_states  # hs[l] = input of layer l (l < L)
    L = ref.config.num_hidden_layers
    want = [torch.nn.functional.cosine_similarity(hs[l], hs[l + 1], dim=-1).mean().item() for l in range(L - 1)]
    assert got["cosine"].tolist() == pytest.approx(want, abs=1e-5)


def test_cross_layer_end_to_end_toy(toy, tmp_path):
    res = experiments.run("cross-layer", out=tmp_path / "cl", record_every=1, **toy)
    mix = res["mixing"]
    lam = mix[(mix.variant == "value-residual")]
    assert set(lam["layer"]) == {1} and lam[lam.step == 0]["weight"].tolist() == [0.5]
    assert sorted(set(lam["step"])) == list(range(toy["steps"] + 1))  # every step before its update, then the end
    assert lam[lam.step == toy["steps"]]["weight"].iloc[0] != 0.5  # λ is learned
    two = mix[(mix.variant == "value-residual-2w") & (mix.step == 0)]
    assert sorted(two["source"]) == ["V1", "V2"]
    dense0 = mix[(mix.variant == "denseformer") & (mix.step == 0)].set_index(["layer", "source"])["weight"]
    assert dense0[(0, "X1")] == 1 and dense0[(0, "X0")] == 0 and dense0[(1, "X2")] == 1  # one-hot at init
    dyn = res["mudd_dynamic"]
    assert set(dyn["stream"]) == {"q", "k", "v", "resid"} and len(dyn)
    cos = res["cosine"]
    assert set(cos["model"]) == set(experiments.make_config("cross-layer").variants)
    assert cos["cosine"].between(-1, 1).all() and (cos["layer"] == 0).all()  # 2 layers: one adjacent pair


# ---------------------------------------------------------------- zero-shot
class _NextIdModel(torch.nn.Module):
    """Predicts token id + 1 at every position (a model whose greedy answers are known)."""

    def __init__(self, vocab=50):
        super().__init__()
        self.vocab = vocab
        self.w = torch.nn.Parameter(torch.zeros(1))

    def forward(self, ids):
        return torch.nn.functional.one_hot((ids + 1) % self.vocab, self.vocab).float() * 10 + self.w


def test_lambada_and_hellaswag_scoring_on_known_answers():
    from probe.experiments.zero_shot import hellaswag_accuracy, lambada_accuracy, split_last_word

    m = _NextIdModel()
    ex = [([1, 2, 3], [4, 5]), ([1, 2, 3], [4, 6]), ([7], [8]), (list(range(40)), [40, 41])]
    r = lambada_accuracy(m, ex, ctx=8)  # context cut to the last tokens still predicts id + 1
    assert r == {"accuracy": 0.75, "n": 4}
    hs = [([1, 2], [[9, 9], [3, 4], [5, 5]], 1), ([1, 2], [[3, 4], [3, 5]], 1)]
    assert hellaswag_accuracy(m, hs, ctx=8) == {"accuracy": 0.5, "n": 2}
    assert split_last_word("the cat sat on the mat ") == ("the cat sat on the", " mat")


def test_wikitext_windows_are_non_overlapping_and_cover_the_targets():
    from probe.data import load_tokenizer
    from probe.experiments.zero_shot import wikitext_windows

    tok = load_tokenizer("probe-bpe-8k")
    w = wikitext_windows("wikitext-2-test", tok, 64, max_windows=5)
    assert w.shape == (5, 65)
    assert torch.equal(w[1:, 0], w[:-1, -1])  # window i+1 starts at the last token of window i: targets tile


def test_zero_shot_end_to_end_and_offline_loaders(toy, tmp_path, monkeypatch):
    from probe.experiments import zero_shot as Z

    res = experiments.run(
        "zero-shot",
        out=tmp_path / "zs",
        seeds=(0, 1),
        variants=("baseline", "sinklogit"),
        wikitext=toy["data"],
        max_windows=4,
        **{k: v for k, v in toy.items()},
    )
    pm = res["per_model"]
    assert len(pm) == 4 and (pm["wikitext2_tokens"] == 4 * toy["ctx"]).all()
    t = res["table12"].set_index("variant")
    assert t.at["baseline", "wikitext2_ppl_mean"] == pytest.approx(pm[pm.variant == "baseline"]["wikitext2_ppl"].mean())
    monkeypatch.setattr("probe.data.corpus._hub_reachable", lambda *a, **k: False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    for loader in (Z.load_lambada, Z.load_hellaswag):
        with pytest.raises(ConnectionError) as e:
            loader()
        assert "\n" not in str(e.value) and "unreachable" in str(e.value)
    assert Z.resolve_wikitext("auto") == "wikitext-2-test"
    from probe.experiments.command import main

    assert main(["zero-shot", "--out", str(tmp_path / "off"), "--tasks", "hellaswag", "--variants", "baseline"]) == 2
    assert not (tmp_path / "off").exists()  # failed before training anything or writing


@pytest.mark.parametrize(
    "argv, message",
    [
        (["sink-emergence", "--lr", "nan"], "argument --lr: expected a finite number >= 0, got 'nan'"),
        (["superposition", "--seeds", "0", "-1"], "argument --seeds: expected a finite number >= 0, got '-1'"),
        (["depth-routing", "--steps", "0"], "steps=0 must be at least 1"),
        (["decomposition", "--ctx", "1"], "ctx=1 must be at least 2"),
        (["gatedv-controls", "--lr", "0"], "lr=0.0 must be > 0"),
        (["sink-emergence", "--batch-size", "0"], "batch_size=0 must be at least 1"),
    ],
)
def test_recipe_numbers_are_checked_before_any_work(argv, message, tmp_path, capsys):
    """A negative, non-finite or zero count / rate is one exit-2 line naming it (was a traceback after training
    started: NaN loss, or an AttributeError), and nothing is written."""
    from probe.experiments.command import main

    assert main([argv[0], "--out", str(tmp_path / "bad"), *argv[1:]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"python -m probe.experiments {argv[0]}: error:") and message in err[0]
    assert not (tmp_path / "bad").exists()
