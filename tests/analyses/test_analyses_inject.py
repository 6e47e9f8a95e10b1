"""Value-noise injection and exposure (docs/definitions.md#injection, Wang 2026 §5 and App. C)."""

import pytest
import torch

from probe.analyses.inject import (
    JunkDraws,
    conditions,
    corrupt,
    exposure_stats,
    inject,
    median_norm,
    own_directions,
    quiet_mask,
)
from probe.hooks import names
from tests.support.analyses import every_variant, periodic, tiny, trained_periodic, windows


def test_quiet_reads_are_the_floor_qT_smallest_with_ties_by_position():
    norms = torch.tensor([3.0, 1.0, 2.0, 1.0, 5.0, 1.0, 4.0, 6.0])[None, :, None]  # T = 8
    assert quiet_mask(norms, 0.25)[0, :, 0].nonzero().flatten().tolist() == [1, 3]  # ⌊2⌋ smallest; tie -> earlier
    assert quiet_mask(norms, 0.5)[0, :, 0].nonzero().flatten().tolist() == [1, 2, 3, 5]
    assert quiet_mask(norms[:, :7], 0.25).sum() == 1  # ⌊0.25 * 7⌋ = 1
    assert median_norm(norms)[0, 0] == pytest.approx(2.5)  # linear interpolation between 2 and 3
    x = torch.rand(3, 7, 2, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(median_norm(x), torch.quantile(x.transpose(1, 2), 0.5, dim=-1))


def reads(B=3, T=8, Hkv=2, dh=4, seed=0):
    return torch.randn(B, T, Hkv, dh, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("kind", ["structured", "same-context", "gaussian", "random-direction"])
def test_dose_zero_is_the_identity_and_only_quiet_reads_move(kind):
    v = reads()
    draws = JunkDraws(kind, v.shape, seed=0, batch=0, layer=0)
    assert corrupt(v, 0.0, 0.25, draws) is v
    out = corrupt(v, 0.8, 0.25, draws)
    moved = (out != v).any(-1)
    assert torch.equal(moved, quiet_mask(v.norm(dim=-1), 0.25))
    step = (out - v).norm(dim=-1)[moved]  # each quiet read moves by dose * m_h (u is a unit vector)
    m = median_norm(v.norm(dim=-1))[:, None, :].expand(moved.shape)[moved]
    assert torch.allclose(step, 0.8 * m, rtol=1e-5)


def test_structured_and_same_context_junk_come_from_the_right_pool():
    B, T, Hkv = 3, 6, 2
    ident = torch.zeros(B, T, Hkv, B * T)  # each read is the one-hot of its flat (sequence, position)
    for b in range(B):
        for t in range(T):
            ident[b, t, :, b * T + t] = 1.0
    s = JunkDraws("structured", ident.shape, seed=1, batch=0, layer=0).directions(ident).argmax(-1)
    own = (torch.arange(B)[:, None] * T + torch.arange(T))[..., None]
    assert (s != own).all() and (s // T != torch.arange(B)[:, None, None]).any()  # other positions, other sequences
    c = JunkDraws("same-context", ident.shape, seed=1, batch=0, layer=0).directions(ident).argmax(-1)
    assert (c != own).all() and (c // T == torch.arange(B)[:, None, None]).all()  # same sequence only
    with pytest.raises(ValueError, match="at least 2 sequences"):
        JunkDraws("structured", (1, T, Hkv, 4), seed=0, batch=0, layer=0)


def test_draws_are_keyed_by_seed_batch_and_layer():
    v = reads()
    u = lambda **k: JunkDraws("gaussian", v.shape, **k).directions(v)  # noqa: E731
    assert torch.equal(u(seed=0, batch=1, layer=2), u(seed=0, batch=1, layer=2))
    assert not torch.equal(u(seed=0, batch=1, layer=2), u(seed=0, batch=1, layer=3))
    assert not torch.equal(u(seed=0, batch=1, layer=2), u(seed=0, batch=2, layer=2))
    assert not torch.equal(u(seed=0, batch=1, layer=2), u(seed=1, batch=1, layer=2))
    r = JunkDraws("random-direction", v.shape, seed=0, batch=0, layer=0).directions(v)
    assert r.shape == (2, 4) and torch.allclose(r.norm(dim=-1), torch.ones(2))  # one direction per KV head


def test_own_direction_needs_a_projection_gate():
    with pytest.raises(ValueError, match="needs a projection gate"):
        inject(tiny("baseline"), windows(1, 2, 8), junk="own-direction", progress=False)
    with pytest.raises(ValueError, match="needs a projection gate"):
        own_directions(tiny("normgate"))
    from probe.models import create

    untrained = create("projgate", n_layers=2, d_model=32, n_heads=4, d_mlp=64, n_ctx=64, vocab_size=97)
    with pytest.raises(ValueError, match=r"layer 0, KV head\(s\) \[0, 1, 2, 3\] is zero"):  # w = 0 at init
        own_directions(untrained)
    with torch.no_grad():
        for blk in untrained.blocks:
            blk.attn.gate.w.normal_()
        untrained.blocks[1].attn.gate.w[2].zero_()
    with pytest.raises(ValueError, match=r"layer 1, KV head\(s\) \[2\] is zero"):  # w_h = 0 has no direction
        own_directions(untrained)
    model = tiny("sink+proj")
    res = inject(model, windows(1, 2, 8), junk="own-direction", doses=[0.5], progress=False)
    assert res["results"]["delta"].iloc[0] != 0
    w = own_directions(model)[1]
    v = reads(Hkv=4, dh=8)
    out = corrupt(v, 1.0, 0.5, JunkDraws("own-direction", v.shape, 0, 0, 1, w))
    step = (out - v)[quiet_mask(v.norm(dim=-1), 0.5)]  # (n, dh) rows along w_h of their head
    cos = torch.nn.functional.cosine_similarity(step, w[quiet_mask(v.norm(dim=-1), 0.5).nonzero()[:, 2]], dim=-1)
    assert torch.allclose(cos, torch.ones_like(cos), atol=1e-5)


def test_unknown_junk_and_cutoff_raise():
    with pytest.raises(ValueError, match="unknown junk type"):
        conditions(["noise"], ["q25"], [0.1])
    with pytest.raises(ValueError, match="unknown cutoff"):
        conditions(["gaussian"], ["q10"], [0.1])


def test_dose_zero_changes_nothing_and_tiny_doses_change_almost_nothing():
    model = tiny("sinklogit")
    res = inject(model, windows(2, 2, 12), junk=["structured", "gaussian"], doses=[0.0, 1e-6], progress=False)
    r = res["results"].set_index(["junk", "dose"])["delta"]
    assert r[("structured", 0.0)] == 0.0 and r[("gaussian", 0.0)] == 0.0
    assert abs(r[("structured", 1e-6)]) < 1e-4 and abs(r[("gaussian", 1e-6)]) < 1e-4
    assert r[("structured", 1e-6)] != 0.0  # the tiny dose did run through the corrupted forward


def test_deterministic_for_a_seed_and_batching_does_not_change_results():
    model = tiny("baseline", n_kv_heads=2)
    toks = windows(2, 3, 12)
    kw = dict(
        junk=["structured", "same-context", "gaussian", "random-direction"],
        cutoffs=["q25", "median"],
        doses=[0.4, 1.6],
        progress=False,
        exposure=False,
    )
    a = inject(model, toks, seed=3, **kw)["results"]
    b = inject(model, toks, seed=3, **kw)["results"]
    assert a["delta"].tolist() == b["delta"].tolist()
    one_at_a_time = inject(model, toks, seed=3, max_rows=3, **kw)["results"]  # one condition per forward
    assert one_at_a_time["delta"].tolist() == pytest.approx(a["delta"].tolist(), abs=1e-5)
    other = inject(model, toks, seed=4, **kw)["results"]
    assert other["delta"].tolist() != a["delta"].tolist()


def test_larger_doses_change_loss_more_on_a_trained_model():
    model, final = trained_periodic()
    assert final < 1.0  # it learned to read back a period (uniform guessing costs log 32 = 3.47)
    res = inject(
        model,
        periodic(2, 4, 32, period=2, seed=7),
        junk=["structured", "gaussian"],
        cutoffs="median",
        doses=[0.5, 2.0, 8.0],
        progress=False,
    )
    for junk, g in res["results"].groupby("junk"):
        deltas = g.sort_values("dose")["delta"].tolist()
        assert abs(deltas[0]) < deltas[1] < deltas[2], (junk, deltas)
        assert deltas[2] > 1.0
    per_batch = res["per_batch"]
    assert len(per_batch) == 2 * 6 and per_batch["loss_clean"].nunique() == 2


def test_exposure_sums_to_one_when_every_read_is_quiet():
    model = tiny("sinklogit")
    res = exposure_stats(model, windows(1, 2, 12), cutoffs=[1.0, "median", "q25"])
    heads = res["exposure_heads"]
    full = heads[heads["cutoff"] == "1.0"]
    assert (full["quiet_share"] + full["phantom_share"]).tolist() == pytest.approx([1.0] * 8, abs=1e-5)
    assert (full["phantom_share"] > 0).all()
    e = res["exposure"].set_index("cutoff")["quiet_share"]
    assert e["q25"] < e["median"] < e["1.0"]


@pytest.mark.parametrize("variant,over", every_variant())
def test_exposure_matches_the_pattern(variant, over):
    model = tiny(variant, **over)
    toks = windows(1, 2, 12)
    res = exposure_stats(model, toks, cutoffs=["q25", "median"])
    _, cache = model.run_with_cache(toks[0, :, :-1])
    G = model.probe_info.kv_group
    for l in range(2):
        pattern = cache[names.attn(l, "pattern")].double().abs()  # (B, H, T, T); signed rows: shares of Σ|a|
        norms = cache[names.attn(l, "v")].norm(dim=-1)  # (B, T, Hkv)
        # the row's total mass: its real keys and the phantom (0 where rows may sum past one and none fires)
        phantom = cache[p].double() if (p := names.attn(l, "phantom")) in cache else torch.zeros(pattern.shape[:3])
        total = pattern.sum(-1) + phantom  # (B, H, T)
        for cutoff, q in (("q25", 0.25), ("median", 0.5)):  # noqa: B007 (the query reads @cutoff)
            quiet = quiet_mask(norms, q).permute(0, 2, 1).repeat_interleave(G, 1).double()  # (B, H, T) per key
            share = ((pattern * quiet[:, :, None, :]).sum(-1) / total)[:, :, 1:].mean((0, 2))
            got = res["exposure_heads"].query("layer == @l and cutoff == @cutoff")["quiet_share"].tolist()
            assert got == pytest.approx(share.tolist(), abs=1e-5)
        got = res["exposure_heads"].query("layer == @l and cutoff == 'q25'")["phantom_share"].tolist()
        assert got == pytest.approx((phantom / total)[:, :, 1:].mean((0, 2)).tolist(), abs=1e-6)


def test_battery_reports_exposure_conditions_and_progress(capsys):
    res = inject(
        tiny("sink+proj"),
        windows(2, 2, 8),
        junk=["gaussian"],
        cutoffs=["q25", "median"],
        doses=[0.2, 0.4],
        progress=True,
    )
    assert len(res["results"]) == 4 and set(res["results"]["cutoff"]) == {"q25", "median"}
    assert res["exposure"]["cutoff"].tolist() == ["q25", "median"]
    assert res["meta"]["seed"].iloc[0] == 0 and res["results"].attrs["meta"]["doses"] == "0.2,0.4"
    assert "injection" in capsys.readouterr().err
    inject(tiny("baseline"), windows(1, 2, 8), junk=["gaussian"], doses=[0.2], progress=False)
    assert capsys.readouterr().err == ""
