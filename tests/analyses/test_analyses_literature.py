"""Sink^ε (Gu et al.), massive activations (Sun et al.), active/dormant heads (Guo et al.): hand-built tensors with
known answers, tiny models whose attention or activations are forced, streaming == pattern, cross-checks with sinks."""

import math

import pytest
import torch

import probe
from probe.analyses.dormant import DormantAccumulator, dormant_heads
from probe.analyses.massive import MassiveAccumulator, massive_activations, median_abs, top_values
from probe.analyses.sink_heads import SinkEpsAccumulator, sink_heads
from probe.analyses.sinks import sink_stats
from probe.checkpoints.tiny import build_tiny
from probe.hooks.info import ModelInfo
from probe.present.dormant import dormant_figure, dormant_heads_figure
from probe.present.massive import massive_figure
from probe.present.sink_eps import sink_eps_figure, sink_eps_layers_figure, sink_eps_trend_figure
from tests.support.analyses import every_variant, tiny, windows


def info(L=2, H=2, Hkv=2, layer_types=None, window=None, sink_token=False):
    return ModelInfo(
        name="hand",
        family="test",
        n_layers=L,
        d_model=8,
        n_heads=H,
        n_kv_heads=Hkv,
        d_head=4,
        n_ctx=16,
        vocab_size=10,
        layer_types=layer_types or [],
        sliding_window=window,
        sink_token=sink_token,
    )


def force_key0(model, layers=None, heads=None, when=None):
    """Permanent hooks that make the chosen heads put (almost) all real mass on key 0: every query is c·e_0 and only
    key 0 has a key (big·e_0). ``when`` (a dict filled by an embedding hook) restricts it to some sequences."""
    info_ = model.probe_info
    layers = range(info_.n_layers) if layers is None else layers
    heads = list(range(info_.n_heads)) if heads is None else heads
    kv = sorted({h // info_.kv_group for h in heads})

    def rows(x):
        return torch.ones(x.shape[0], dtype=torch.bool, device=x.device) if when is None else when["on"]

    def q_hook(q, hook):
        q, on = q.clone(), rows(q)
        for h in heads:
            q[on, :, h] = 0
            q[on, :, h, 0] = 10.0
        return q

    def k_hook(k, hook):
        k, on = k.clone(), rows(k)
        for h in kv:
            k[on, :, h] = 0
            k[on, 0, h, 0] = 10.0
        return k

    for l in layers:
        model.add_hook(f"blocks.{l}.attn.hook_rot_q", q_hook, is_permanent=True)  # the query the scores take
        model.add_hook(f"blocks.{l}.attn.hook_rot_k", k_hook, is_permanent=True)
    return model


def numbers(df):
    return torch.tensor(df.select_dtypes("number").to_numpy(float))


# ------------------------------------------------------------------------------------------------------------ Sink^ε


def test_sink_eps_hand_built_shares():
    acc = SinkEpsAccumulator(info(L=2, H=2, Hkv=1), eps=(0.3, 0.5))
    T = 4
    key0 = torch.zeros(1, 2, T)
    key0[0, 0] = torch.tensor([1.0, 0.75, 0.5, 0.25])  # head 0: rows t >= 1 average 0.5 (row 0 excluded)
    key0[0, 1] = torch.tensor([1.0, 0.2, 0.2, 0.2])  # head 1: 0.2
    acc.add(0, key0, torch.ones(1, 2, T), torch.zeros(1, 2, T))
    acc.add(1, torch.full((1, 2, T), 0.9), torch.ones(1, 2, T), torch.zeros(1, 2, T))  # layer 1: both sink heads
    t = acc.tables()
    assert t["heads"]["key0_mass"].tolist() == pytest.approx([0.5, 0.2, 0.9, 0.9])
    lay = t["layers"].set_index(["epsilon", "layer"])["sink_share"]
    assert lay[(0.3, 0)] == 0.5 and lay[(0.3, 1)] == 1.0
    assert lay[(0.5, 0)] == 0.0 and lay[(0.5, 1)] == 1.0  # 0.5 is not > 0.5
    s = t["summary"].set_index("epsilon")
    assert s.loc[0.3, "sink_share"] == pytest.approx(0.75) and s.loc[0.5, "sink_share"] == pytest.approx(0.5)
    assert s.loc[0.3, "n_sink_heads"] == 3 and s.loc[0.3, "n_heads"] == 4
    assert s.loc[0.3, "uniform_ref"] == pytest.approx((1 / 2 + 1 / 3 + 1 / 4) / 3)


def test_sink_eps_counts_query_zero_only_when_asked():
    key0 = torch.tensor([1.0, 0.2, 0.2, 0.2]).view(1, 1, 4)
    for q0, want in ((False, 0.2), (True, (1 + 0.6) / 4)):
        acc = SinkEpsAccumulator(info(L=1, H=1, Hkv=1), eps=0.3, include_query0=q0)
        acc.add(0, key0, torch.ones(1, 1, 4), torch.zeros(1, 1, 4))
        t = acc.tables()
        assert t["heads"]["key0_mass"].iloc[0] == pytest.approx(want)
        assert t["summary"]["sink_share"].iloc[0] == (1.0 if want > 0.3 else 0.0)


def test_sink_eps_phantom_mass_is_not_key0_mass():
    """Rows sum to 1 - phantom: the score is the absolute column-0 mass; the share of real mass is reported beside."""
    acc = SinkEpsAccumulator(info(L=1, H=1, Hkv=1), eps=0.3)
    T = 3
    acc.add(0, torch.full((1, 1, T), 0.2), torch.full((1, 1, T), 0.4), torch.full((1, 1, T), 0.6))
    h = acc.tables()["heads"].iloc[0]
    assert h["key0_mass"] == pytest.approx(0.2) and h["key0_share_real"] == pytest.approx(0.5)
    assert h["phantom_share"] == pytest.approx(0.6)
    assert acc.tables()["summary"]["sink_share"].iloc[0] == 0.0


def test_sink_eps_sliding_layers_rows_that_see_key0():
    acc = SinkEpsAccumulator(info(L=1, H=1, Hkv=1, layer_types=["sliding"], window=3), eps=0.3)
    key0 = torch.tensor([1.0, 0.6, 0.4, 0.0, 0.0, 0.0]).view(1, 1, 6)  # key 0 leaves the window at t = 3
    acc.add(0, key0, torch.ones(1, 1, 6), torch.zeros(1, 1, 6))
    t = acc.tables()
    assert t["heads"]["key0_mass"].iloc[0] == pytest.approx(1.0 / 5)
    assert t["heads"]["key0_mass_key0"].iloc[0] == pytest.approx(0.5)
    s = t["summary"].iloc[0]
    assert s["sink_share"] == 0.0 and s["sink_share_key0"] == 1.0
    acc2 = SinkEpsAccumulator(info(L=1, H=1, Hkv=1, layer_types=["sliding"], window=3), eps=0.3, window_rows="key0")
    acc2.add(0, key0, torch.ones(1, 1, 6), torch.zeros(1, 1, 6))
    assert acc2.tables()["summary"]["sink_share"].iloc[0] == 1.0


@pytest.mark.parametrize("method", ["streaming", "pattern"])
def test_attention_forced_onto_key0_gives_sink_eps_one(method):
    model = force_key0(tiny("baseline"))
    res = sink_heads(model, windows(1, 2, 12), eps=(0.3, 0.9), method=method)
    assert res["heads"]["key0_mass"].tolist() == pytest.approx([1.0] * 8, abs=1e-6)
    assert res["summary"]["sink_share"].tolist() == [1.0, 1.0]
    assert (res["layers"]["sink_share"] == 1.0).all()


def test_uniform_attention_gives_the_causal_reference():
    """All keys zero -> uniform rows: key-0 mass of row t is 1/(t+1), so the score is the causal-uniform mean."""
    model = tiny("baseline")
    for l in range(2):
        model.add_hook(f"blocks.{l}.attn.hook_k", lambda k, hook: torch.zeros_like(k), is_permanent=True)
    T = 16
    res = sink_heads(model, windows(1, 2, T), eps=(0.15, 0.3))
    ref = sum(1 / (t + 1) for t in range(1, T)) / (T - 1)  # 0.1587
    assert res["heads"]["key0_mass"].tolist() == pytest.approx([ref] * 8, abs=1e-6)
    s = res["summary"].set_index("epsilon")["sink_share"]
    assert s[0.15] == 1.0 and s[0.3] == 0.0


def test_huge_sink_logits_take_the_mass_off_key0():
    model = tiny("sinklogit")
    with torch.no_grad():
        for blk in model.blocks:
            blk.attn.sink.fill_(80.0)  # far above the forced key-0 logit (~35)
    res = sink_heads(force_key0(model), windows(1, 2, 10), eps=0.3)
    h = res["heads"]
    assert h["phantom_share"].tolist() == pytest.approx([1.0] * 8, abs=1e-6)
    assert h["key0_mass"].max() < 1e-6 and h["key0_share_real"].min() > 0.999  # real mass all on key 0, but tiny
    assert res["summary"]["sink_share"].iloc[0] == 0.0


@pytest.mark.parametrize("variant,over", every_variant())
def test_sink_eps_streaming_equals_pattern_and_matches_sink_stats(variant, over):
    model = tiny(variant, **over)
    toks = windows(2, 3, 16)
    fast = sink_heads(model, toks, eps=(0.1, 0.2, 0.3))
    ref = sink_heads(model, toks, eps=(0.1, 0.2, 0.3), method="pattern")
    for key in ("heads", "layers", "summary"):
        assert torch.allclose(numbers(fast[key]), numbers(ref[key]), atol=1e-5, equal_nan=True), key
    stats = sink_stats(model, toks)["heads"]  # the share of real mass is sinks.py's pos0_share
    assert fast["heads"]["key0_share_real"].tolist() == pytest.approx(stats["pos0_share"].tolist(), abs=1e-6)
    assert fast["heads"]["phantom_share"].tolist() == pytest.approx(stats["phantom_share"].tolist(), abs=1e-6)
    assert fast["meta"]["key0"].iloc[0] == ("learned sink token" if variant == "sinktoken" else "first input token")
    if variant in ("sinklogit", "offbyone"):
        assert (fast["heads"]["key0_mass"] < fast["heads"]["key0_share_real"]).all()


@pytest.mark.parametrize("family", ["gpt_oss", "llama"])
def test_sink_eps_on_tiny_hf_models(tmp_path, family):
    model = probe.load(str(build_tiny(family, tmp_path / family)))
    toks = torch.randint(2, 96, (2, 2, 13), generator=torch.Generator().manual_seed(0))
    fast, ref = sink_heads(model, toks, eps=(0.1, 0.3)), sink_heads(model, toks, eps=(0.1, 0.3), method="pattern")
    assert torch.allclose(numbers(fast["heads"]), numbers(ref["heads"]), atol=1e-5, equal_nan=True)
    if family == "gpt_oss":  # sliding layer with a window shorter than the sequence: the key0-row columns differ
        sl = fast["heads"][fast["heads"]["layer_type"] == "sliding"]
        assert (sl["key0_mass_key0"] > sl["key0_mass"]).all() and fast["heads"]["phantom_share"].min() > 0
    forced = sink_heads(force_key0(model), toks, eps=0.3)["heads"]
    assert forced["key0_share_real_key0"].min() > 0.999  # every row that sees key 0 puts its real mass there
    if family == "gpt_oss":  # ... and rows past the window see no key 0 at all
        sl = forced[forced["layer_type"] == "sliding"]
        assert (sl["key0_share_real"] < 0.5).all()


def test_sink_eps_validates_and_figures():
    with pytest.raises(ValueError, match="eps"):
        sink_heads(tiny("baseline"), windows(1, 1, 4), eps=(1.5,))
    res = sink_heads(tiny("baseline"), windows(1, 2, 8), eps=(0.1, 0.3))
    fig = sink_eps_figure([res, res])
    assert len(fig.data) == 2 * 2 + 1  # one line per model and ε, one heatmap
    summary = res["summary"].assign(step=1000)
    import pandas as pd

    trend = sink_eps_trend_figure(pd.concat([summary, summary.assign(step=2000)]))
    assert [list(t.x) for t in trend.data] == [[1000, 2000], [1000, 2000]]
    uniform = tiny("baseline")  # zero keys: key-0 score = causal-uniform mean 0.159 at T = 16, below 0.3
    for l in range(2):
        uniform.add_hook(f"blocks.{l}.attn.hook_k", lambda k, hook: torch.zeros_like(k), is_permanent=True)
    early = sink_heads(uniform, windows(1, 2, 16), eps=(0.1, 0.3))
    forced = sink_heads(force_key0(tiny("baseline")), windows(1, 2, 16), eps=(0.1, 0.3))
    layers = pd.concat(
        [early["layers"].assign(model="m@step1000", step=1000), forced["layers"].assign(model="m@step2000", step=2000)]
    )
    heat = sink_eps_layers_figure(layers, 0.3).data[0]
    # layers on x (as in every per-layer figure), one row per checkpoint; zero keys never sink, forced key 0 always
    assert list(heat.x) == [0, 1] and list(heat.y) == ["1000", "2000"]
    assert heat.z.tolist() == [[0.0, 0.0], [1.0, 1.0]]


# ------------------------------------------------------------------------------------------------------------ massive


def test_median_abs_is_torch_quantile():
    """Odd and even lengths, and ties at and around the middle (the even case's upper value is found without a second
    selection)."""
    g = torch.Generator().manual_seed(0)
    for n in (7, 8, 1, 2, 10):
        a = torch.rand(3, n, generator=g)
        torch.testing.assert_close(median_abs(a), torch.quantile(a, 0.5, dim=1), atol=0, rtol=0)
        ties = torch.randint(0, 3, (4, n), generator=g).float()  # many equal values
        torch.testing.assert_close(median_abs(ties), torch.quantile(ties, 0.5, dim=1), atol=0, rtol=0)
    a = torch.tensor([[1.0, 2.0, 2.0, 5.0], [1.0, 1.0, 2.0, 9.0], [3.0, 3.0, 3.0, 3.0]])
    torch.testing.assert_close(median_abs(a), torch.tensor([2.0, 1.5, 3.0]), atol=0, rtol=0)


def test_top_values_are_topk_with_ties_in_index_order():
    g = torch.Generator().manual_seed(0)
    for n, k in [(50, 3), (5000, 10), (300_000, 10)]:
        a = torch.rand(2, n, generator=g)
        vals, idx = top_values(a, k)
        want_v, want_i = a.topk(k, dim=1)
        assert torch.equal(vals, want_v) and torch.equal(idx, want_i)  # distinct values: exactly topk's
        ties = torch.randint(0, 4, (2, n), generator=g).float()  # every value repeated: the first k positions of 3
        vals, idx = top_values(ties, k)
        for b in range(2):
            assert torch.equal(idx[b], (ties[b] == 3).nonzero().squeeze(1)[:k]) and bool((vals[b] == 3).all())


def test_massive_hand_built_tensor():
    acc = MassiveAccumulator(info(L=1, H=1, Hkv=1), top_k=2)
    B, T, d = 2, 4, 8
    h = torch.full((B, T, d), 0.5)
    h[:, :, 0] = -0.25  # a quarter of the entries smaller: the median stays 0.5
    h[1, 2, 5] = -1000.0  # massive: > 100 and > 1000 x 0.5
    h[0, 3, 6] = 400.0  # > 100 but only 800 x the median: not massive
    tokens = torch.arange(B * T).view(B, T)
    out = acc.add_stream(0, h, tokens, batch=3)
    assert out["top_pos"].tolist() == [3, 2]
    assert out["massive_pos"].tolist() == [[False] * 4, [False, False, True, False]]
    t = acc.tables()
    lay = t["layers"].iloc[0]
    assert lay["median"] == pytest.approx(0.5) and lay["n_massive"] == 1 and lay["n_massive_dims"] == 1
    assert lay["top1"] == pytest.approx((400 + 1000) / 2) and lay["top2"] == pytest.approx(0.5)
    assert lay["ratio"] == pytest.approx((800 + 2000) / 2) and lay["massive_pos0_share"] == 0
    top = t["top"][t["top"]["layer"] == 0].iloc[0]
    assert (top["batch"], top["row"], top["position"], top["dim"], top["token_id"]) == (3, 1, 2, 5, 6)
    assert top["value"] == -1000.0 and top["ratio"] == pytest.approx(2000)
    dims = t["dims"]
    assert dims[["layer", "dim", "count", "windows", "pos0_share"]].values.tolist() == [[0, 5, 1, 1, 0.0]]
    s = t["summary"].iloc[0]
    assert s["massive"] and s["massive_dims"] == "5" and s["max_position"] == 2 and s["max_dim"] == 5


def inject_coordinate(model, token=1, dim=7, value=5000.0):
    with torch.no_grad():
        model.embed.weight[token, dim] = value
    return model


@pytest.mark.parametrize("pos", [5, 0])
def test_injected_huge_coordinate_is_found(pos):
    model = inject_coordinate(tiny("baseline"))
    toks = windows(2, 3, 16, low=2)  # token 1 appears only where it is put
    toks[1, 2, pos] = 1
    res = massive_activations(model, toks, top_k=3)
    top = res["top"][res["top"]["rank"] == 0]
    assert len(top) == 3  # two layer inputs and the last output
    assert set(top["position"]) == {pos} and set(top["dim"]) == {7} and set(top["token_id"]) == {1}
    assert set(top["batch"]) == {1} and set(top["row"]) == {2}
    assert top["magnitude"].min() > 4900
    dims = res["dims"]
    assert dims["dim"].tolist() == [7, 7, 7] and (dims["pos0_share"] == (1.0 if pos == 0 else 0.0)).all()
    s = res["summary"].iloc[0]
    assert s["massive"] and s["massive_dims"] == "7" and s["massive_pos0_share"] == (1.0 if pos == 0 else 0.0)
    assert s["max_position"] == pos and s["max_dim"] == 7 and s["first_massive_layer"] == 0
    assert res["meta"]["model"].iloc[0] == "tiny-baseline" and res["meta"]["abs_threshold"].iloc[0] == 100.0


@pytest.mark.parametrize("variant,over", [("sinklogit", dict(n_kv_heads=2)), *every_variant()])
def test_massive_alignment_matches_sink_statistics(variant, over):
    """key0_mass and r0 per layer are the sink analyses' numbers, computed in the same pass (and Sink^eps's key-0 mass
    equals the pattern's for every variant: test_sink_eps_streaming_equals_pattern_and_matches_sink_stats)."""
    model = tiny(variant, **over)
    toks = windows(2, 2, 12)
    res = massive_activations(model, toks)
    lay = res["layers"].set_index("layer")
    eps = sink_heads(model, toks)["layers"].set_index("layer")
    stats = sink_stats(model, toks)["layers"].set_index("layer")
    for l in range(2):
        assert lay.loc[l, "key0_mass"] == pytest.approx(eps.loc[l, "key0_mass"], abs=1e-6)
        assert lay.loc[l, "r0"] == pytest.approx(stats.loc[l, "r0"], abs=1e-6)
    assert math.isnan(lay.loc[2, "r0"])  # the last output feeds no attention


def test_massive_on_tiny_hf_model_with_a_hook(tmp_path):
    model = probe.load(str(build_tiny("llama", tmp_path / "llama")))

    def bump(x, hook):
        x = x.clone()
        x[0, 3, 11] = -3000.0
        return x

    model.add_hook("hook_embed", bump, is_permanent=True)
    toks = torch.randint(2, 96, (1, 2, 9), generator=torch.Generator().manual_seed(1))
    res = massive_activations(model, toks)
    top = res["top"][res["top"]["rank"] == 0]
    assert set(top["position"]) == {3} and set(top["dim"]) == {11} and set(top["row"]) == {0}
    assert (top["value"] < -2900).all()
    assert res["summary"]["massive_dims"].iloc[0] == "11"
    fig = massive_figure(res)
    assert len(fig.data) == 9  # top1..3, median, threshold; four alignment lines


# ------------------------------------------------------------------------------------------------------------ dormant


def test_dormant_hand_built_inputs():
    acc = DormantAccumulator(info(L=1, H=2, Hkv=2), threshold=0.5, norm_ratio=0.5)
    T = 3
    z = torch.zeros(2, T, 2, 4)
    z[0, :, 0, 0] = 0.1  # head 0, window 0: small output while sinking
    z[1, :, 0, 0] = 1.9  # head 0, window 1: active, large output (head mean 1.0)
    z[:, :, 1, 0] = 1.0  # head 1: constant output
    key0 = torch.zeros(2, 2, T)
    key0[0, 0] = torch.tensor([1.0, 0.9, 0.9])
    key0[1, 0] = torch.tensor([1.0, 0.1, 0.1])
    key0[:, 1] = torch.tensor([1.0, 0.3, 0.3])
    acc.add(0, key0, torch.zeros(2, 2, T), z, domain="A")
    zb = torch.zeros(2, T, 2, 4)
    zb[..., 0] = 1.0  # domain B: every output of norm 1, key-0 mass 0.2 (active)
    acc.add(0, torch.full((2, 2, T), 0.2), torch.zeros(2, 2, T), zb, domain="B")
    t = acc.tables()
    a = t["inputs"][t["inputs"]["domain"] == "A"].set_index(["row", "head"])
    assert a.loc[(0, 0), "key0_mass"] == pytest.approx(0.9) and a.loc[(0, 0), "dormant"]
    assert not a.loc[(1, 0), "dormant"] and not a.loc[(0, 1), "dormant"]
    # head 0's mean output over all four inputs: (0.1 + 1.9 + 1 + 1) / 4 = 1
    assert a.loc[(0, 0), "z_ratio"] == pytest.approx(0.1) and a.loc[(0, 0), "dormant_norm"]
    heads = t["heads"].set_index("head")
    assert heads.loc[0, "dormant_rate"] == 0.25 and heads.loc[0, "z_norm_dormant"] == pytest.approx(0.1)
    assert heads.loc[0, "z_norm_active"] == pytest.approx((1.9 + 1 + 1) / 3) and heads.loc[0, "agreement"] == 1.0
    s = t["summary"].set_index("domain")
    assert s.loc["A", "dormant_share"] == 0.25 and s.loc["B", "dormant_share"] == 0.0
    assert s.loc["all", "dormant_share"] == 0.125 and s.loc["A", "n_windows"] == 2
    sw = t["switching"].iloc[0]
    assert (sw["layer"], sw["head"], sw["dormant_rate[A]"], sw["dormant_rate[B]"], sw["spread"]) == (0, 0, 0.5, 0, 0.5)


def test_domain_dependent_dormant_head_on_a_tiny_model():
    """Head (0, 0) sinks and has its key-0 value drained only on inputs that start with a marker token (domain A)."""
    model = tiny("baseline")
    flag = {}

    def embed_hook(x, hook):
        flag["on"] = (x[:, 0] == model.embed.weight[1]).all(-1)
        return x

    def drain(v, hook):
        v = v.clone()
        v[flag["on"], 0, 0] = 0
        return v

    model.add_hook("hook_embed", embed_hook, is_permanent=True)
    force_key0(model, layers=[0], heads=[0], when=flag)
    model.add_hook("blocks.0.attn.hook_v", drain, is_permanent=True)
    a = windows(2, 3, 16, low=2)
    a[..., 0] = 1
    b = windows(2, 3, 16, low=2, seed=5)
    res = dormant_heads(model, {"A": a, "B": b})
    inputs = res["inputs"]
    h00 = inputs[(inputs["layer"] == 0) & (inputs["head"] == 0)]
    assert (h00["dormant"] == (h00["domain"] == "A")).all()
    assert (h00.loc[h00["domain"] == "A", "key0_mass"] > 0.999).all()
    assert (h00.loc[h00["domain"] == "A", "z_ratio"] < 1e-4).all()  # drained value: no output
    others = inputs[(inputs["layer"] != 0) | (inputs["head"] != 0)]
    assert not others["dormant"].any()
    sw = res["switching"].iloc[0]
    assert (sw["layer"], sw["head"], sw["dormant_rate[A]"], sw["dormant_rate[B]"]) == (0, 0, 1.0, 0.0)
    s = res["summary"].set_index("domain")
    assert s.loc["A", "dormant_share"] == pytest.approx(1 / 8) and s.loc["B", "dormant_share"] == 0
    assert res["heads"].set_index(["layer", "head"]).loc[(0, 0), "agreement"] == 1.0
    assert res["meta"]["corpus"].iloc[0] == "A+B"
    assert len(dormant_figure(res).data) == 4 and len(dormant_heads_figure(res).data) == 2


def test_dormant_output_norms_are_hook_z_norms():
    model = tiny("sink+proj", n_kv_heads=2)
    toks = windows(1, 2, 10)
    res = dormant_heads(model, toks)
    _, cache = model.run_with_cache(toks[0, :, :-1], names_filter=lambda n: n.endswith(("hook_z", "hook_pattern")))
    got = res["inputs"].set_index(["row", "layer", "head"])
    for l in range(2):
        z = cache[f"blocks.{l}.attn.hook_z"][:, 1:].norm(dim=-1).mean(1)  # (B, H)
        p = cache[f"blocks.{l}.attn.hook_pattern"][..., 1:, 0].mean(-1)  # (B, H)
        for b in range(2):
            for h in range(4):
                assert got.loc[(b, l, h), "z_norm"] == pytest.approx(float(z[b, h]), rel=1e-5)
                assert got.loc[(b, l, h), "key0_mass"] == pytest.approx(float(p[b, h]), abs=1e-6)
    assert res["inputs"]["phantom_share"].min() > 0


# ------------------------------------------------------------------------------------------------------------ memory


def test_streaming_analyses_materialise_no_pattern(pattern_requests):
    """Sink^ε, massive activations and dormant heads keep the model on its fast path: no attention call is asked
    for a T x T pattern (the pattern method is, so the spy does see requests when there are some)."""
    asked = pattern_requests
    model = tiny("sinklogit")
    toks = windows(1, 2, 8)
    sink_heads(model, toks)
    massive_activations(model, toks)
    dormant_heads(model, toks)
    assert asked and not any(asked)
    sink_heads(model, toks, method="pattern")
    assert any(asked)
    assert not any(hp.has_hooks() for hp in model.hook_dict.values())  # nothing left behind


def test_dormant_on_gpt_oss_uses_the_rows_that_see_key0(tmp_path):
    model = probe.load(str(build_tiny("gpt_oss", tmp_path / "gpt_oss")))
    info_ = model.probe_info
    toks = torch.randint(2, 96, (1, 2, 11), generator=torch.Generator().manual_seed(2))
    res = dormant_heads(model, toks)
    _, cache = model.run_with_cache(
        toks[0, :, :-1], names_filter=lambda n: n.endswith(("hook_z", "hook_pattern", "hook_phantom"))
    )
    got = res["inputs"].set_index(["row", "layer", "head"])
    for l, kind in enumerate(info_.layer_types):
        end = info_.sliding_window if kind == "sliding" else 10
        p = cache[f"blocks.{l}.attn.hook_pattern"][..., 1:end, 0].mean(-1)
        ph = cache[f"blocks.{l}.attn.hook_phantom"][..., 1:end].mean(-1)
        z = cache[f"blocks.{l}.attn.hook_z"][:, 1:end].norm(dim=-1).mean(1)
        for b in range(2):
            for h in range(info_.n_heads):
                row = got.loc[(b, l, h)]
                assert row["key0_mass"] == pytest.approx(float(p[b, h]), abs=1e-6)
                assert row["phantom_share"] == pytest.approx(float(ph[b, h]), abs=1e-6)
                assert row["z_norm"] == pytest.approx(float(z[b, h]), rel=1e-5)
    assert "sliding" in info_.layer_types and info_.sliding_window < 10


def test_triton_row_masses_give_the_same_numbers():
    """The CUDA path (Triton row masses; here under TRITON_INTERPRET, set by conftest) with 1, 2 and 3 indicator
    columns: dormant heads, Sink^ε and massive activations agree with the default backend."""
    import os

    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        pytest.skip("Triton needs CUDA or TRITON_INTERPRET=1")
    model = tiny("sinklogit", n_kv_heads=2)
    toks = windows(1, 2, 12)
    for fn, key in ((sink_heads, "heads"), (massive_activations, "layers"), (dormant_heads, "inputs")):
        a, b = fn(model, toks)[key], fn(model, toks, backend="triton")[key]
        assert torch.allclose(numbers(a), numbers(b), atol=1e-5, equal_nan=True), fn.__name__
