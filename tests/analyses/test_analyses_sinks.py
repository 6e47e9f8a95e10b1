"""Sink statistics (docs/definitions.md#sink-statistics, docs/definitions.md#sink-rule): hand-built accumulator cases,
a forced sink, streaming == pattern reference."""

import math

import pytest
import torch

from probe.analyses.sinks import SinkAccumulator, sink_stats, sink_stats_reference
from probe.hooks.info import ModelInfo
from tests.support.analyses import every_variant, tiny, windows


def info(L=2, H=2, Hkv=2, layer_types=None, window=None):
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
    )


def test_accumulator_known_values():
    B, H, T = 1, 2, 4
    acc = SinkAccumulator(info(L=1, H=H, Hkv=1))
    pos0 = torch.zeros(B, H, T)
    pos0[:, 0] = torch.tensor([1.0, 0.5, 0.2, 0.3])  # row 0 is excluded from every average
    pos0[:, 1] = 0.1
    phantom = torch.full((B, H, T), 0.25)
    norms = torch.tensor([1.0, 2.0, 3.0, 4.0])[None, :, None]  # median 2.5 (linear interpolation), r0 = 0.4
    acc.add(0, pos0, phantom, norms)
    t = acc.tables()
    heads = t["heads"]
    assert heads.loc[0, "pos0_share"] == pytest.approx((0.5 + 0.2 + 0.3) / 3)
    assert heads.loc[1, "pos0_share"] == pytest.approx(0.1)
    assert heads["phantom_share"].tolist() == pytest.approx([0.25, 0.25])
    assert heads["r0"].tolist() == pytest.approx([0.4, 0.4])
    assert heads.loc[0, "uniform_ref"] == pytest.approx((1 / 2 + 1 / 3 + 1 / 4) / 3)
    layer = t["layers"].iloc[0]
    assert layer["pos0_share"] == pytest.approx(((0.5 + 0.2 + 0.3) / 3 + 0.1) / 2)  # rows, then heads


def test_r0_is_a_mean_of_ratios_per_kv_head_and_sequence():
    acc = SinkAccumulator(info(L=1, H=2, Hkv=2))
    norms = torch.tensor(
        [
            [[1.0, 4.0], [2.0, 4.0], [3.0, 4.0]],  # seq 0: head 0 r0 = 1/2, head 1 r0 = 1
            [[6.0, 1.0], [2.0, 2.0], [2.0, 3.0]],
        ]
    )  # seq 1: head 0 r0 = 3, head 1 r0 = 1/2
    acc.add(0, torch.zeros(2, 2, 3), torch.zeros(2, 2, 3), norms)
    h = acc.tables()["heads"]
    assert h["r0"].tolist() == pytest.approx([(0.5 + 3) / 2, (1 + 0.5) / 2])


def test_sliding_layers_report_queries_that_see_key_zero():
    acc = SinkAccumulator(info(L=2, H=1, Hkv=1, layer_types=["sliding", "full"], window=3))
    T = 6
    pos0 = torch.tensor([1.0, 0.6, 0.3, 0.0, 0.0, 0.0]).view(1, 1, T)  # key 0 leaves the window at t = 3
    for l in range(2):
        acc.add(l, pos0, torch.zeros(1, 1, T), torch.ones(1, T, 1))
    t = acc.tables()
    sliding = t["layers"].iloc[0]
    assert sliding["pos0_share"] == pytest.approx(0.9 / 5)
    assert sliding["pos0_share_key0"] == pytest.approx(0.45)
    assert sliding["uniform_ref"] == pytest.approx((1 / 2 + 1 / 3) / 5)
    assert sliding["uniform_ref_key0"] == pytest.approx((1 / 2 + 1 / 3) / 2)
    assert t["layers"].iloc[1]["uniform_ref"] == pytest.approx(sum(1 / (t + 1) for t in range(1, T)) / 5)
    groups = t["by_type"]["layers"].tolist()
    assert groups == ["all", "full", "sliding", "sliding (key 0 in window)"]


def test_sink_formed_flag_uses_layers_past_the_first():
    T = 8
    ref = sum(1 / (t + 1) for t in range(1, T)) / (T - 1)

    def flag(pos0_later, r0_later):
        acc = SinkAccumulator(info(L=3, H=1, Hkv=1))
        for l in range(3):
            share = 0.0 if l == 0 else pos0_later  # layer 0 never sinks: it must not count
            norms = torch.ones(1, T, 1)
            norms[0, 0, 0] = 5.0 if l == 0 else r0_later
            acc.add(l, torch.full((1, 1, T), share), torch.zeros(1, 1, T), norms)
        return bool(acc.tables()["summary"]["sink_formed"].iloc[0])

    assert flag(3.2 * ref, 0.5)
    assert not flag(2.8 * ref, 0.5)  # too little mass on position 0
    assert not flag(3.2 * ref, 0.85)  # position-0 read not crushed


def forced_sink_model(n_layers=2):
    """Attention forced onto key 0: position 0 has its own embedding direction that every query matches."""
    model = tiny("baseline", pos="learned", n_layers=n_layers)
    H, dh = 4, 8
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("o_proj.weight", "mlp.down.weight", "embed.weight")):
                p.zero_()  # the residual stream stays the position embedding in every layer
        model.pos_embed.weight.zero_()
        model.pos_embed.weight[0, 0] = 10.0
        model.pos_embed.weight[1:, 1] = 10.0
        for blk in model.blocks:
            blk.attn.q_proj.weight.zero_()
            blk.attn.k_proj.weight.zero_()
            for h in range(H):
                blk.attn.q_proj.weight[h * dh, :2] = 10.0  # every query has a large component along key 0's
                blk.attn.k_proj.weight[h * dh, 0] = 10.0  # only position 0 has a key
    return model


def test_attention_forced_onto_key_zero_gives_share_one():
    model = forced_sink_model()
    toks = windows(1, 2, 12)
    for fn in (sink_stats, sink_stats_reference):
        res = fn(model, toks)
        assert res["heads"]["pos0_share"].tolist() == pytest.approx([1.0] * 8, abs=1e-6)
        assert res["summary"]["phantom_share"].iloc[0] == 0


@pytest.mark.parametrize("variant,over", every_variant())
def test_streaming_equals_pattern_reference(variant, over):
    model = tiny(variant, **over)
    toks = windows(2, 3, 16)
    fast, ref = sink_stats(model, toks), sink_stats_reference(model, toks)
    for key in ("heads", "layers", "summary", "by_type"):
        a, b = fast[key].select_dtypes("number"), ref[key].select_dtypes("number")
        assert list(a.columns) == list(b.columns)
        assert torch.allclose(
            torch.tensor(a.to_numpy(float)), torch.tensor(b.to_numpy(float)), atol=1e-5, equal_nan=True
        ), key
    if variant == "sinklogit":
        assert fast["summary"]["phantom_share"].iloc[0] > 0.01
        sinks = torch.stack([blk.attn.sink.detach() for blk in model.blocks]).flatten()
        assert fast["heads"]["sink_logit"].tolist() == pytest.approx(sinks.tolist())
    if variant == "offbyone":  # a zero phantom logit takes a real share of every row
        assert fast["summary"]["phantom_share"].iloc[0] > 0.05


def test_results_record_identity_and_settings():
    model = tiny("baseline")
    res = sink_stats(model, windows(1, 2, 8))
    meta = res["heads"].attrs["meta"]
    assert meta["model"] == "tiny-baseline" and meta["corpus"] == "custom-tokens" and meta["method"] == "streaming"
    assert res["meta"]["analysis"].iloc[0] == "sinks"
    assert (res["layers"]["model"] == "tiny-baseline").all()
    assert math.isclose(res["summary"]["uniform_ref"].iloc[0], sum(1 / (t + 1) for t in range(1, 8)) / 7)


def test_streaming_pass_materialises_no_pattern(pattern_requests):
    """The streaming pass keeps the model on its fast path: no attention call is asked for a pattern."""
    asked = pattern_requests
    model = tiny("sinklogit")
    sink_stats(model, windows(1, 2, 8))
    assert asked and not any(asked)
    sink_stats_reference(model, windows(1, 2, 8))
    assert any(asked)  # the spy does see pattern requests when there are some


def test_stopping_the_forward_early_leaves_no_hooks_behind():
    model = tiny("sinklogit")
    toks = windows(1, 2, 8)
    with torch.no_grad():
        before = model(toks[0, :, :-1]).logits
    sink_stats(model, toks)
    assert not any(hp.has_hooks() for hp in model.hook_dict.values())
    with torch.no_grad():
        assert torch.equal(model(toks[0, :, :-1]).logits, before)
