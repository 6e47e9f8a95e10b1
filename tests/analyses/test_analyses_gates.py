"""Gate statistics (Wang 2026 App. "Selectivity", Table 8, token identity): hand-built and tiny models."""

import pytest
import torch

from probe.analyses.gates import GateAccumulator, gate_stats
from probe.hooks.info import ModelInfo
from tests.support.analyses import every_variant, gate_reference, tiny, windows


def info(H=1, Hkv=1, L=1):
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
        value_gate="norm",
    )


def causal_uniform(B, H, T, phantom=0.0):
    p = torch.tril(torch.ones(T, T))
    p = p / p.sum(-1, keepdim=True) * (1 - phantom)
    return p.expand(B, H, T, T).clone()


def test_constant_gate_has_zero_selectivity():
    B, T = 2, 6
    tokens = torch.arange(B * T).view(B, T) % 3
    acc = GateAccumulator(info(), tokens.flatten(), min_count=1)
    acc.add(0, causal_uniform(B, 1, T, phantom=0.3), torch.full((B, T, 1), 0.7), tokens)
    t = acc.tables()
    row = t["summary"].iloc[0]
    assert row["selectivity"] == pytest.approx(0.0, abs=1e-7)
    assert row["mean_gate"] == pytest.approx(0.7)
    assert row["spread"] == pytest.approx(0.0, abs=1e-6)
    assert row["read_mean_gate"] == pytest.approx(0.7) and row["frac_below_half"] == 0


def test_selectivity_on_a_two_key_row_with_a_phantom():
    # row 1 puts 0.3 on each of keys 0 and 1 (phantom 0.4): renormalised w = (1/2, 1/2), g = (0, 1)
    pattern = torch.tensor([[[[0.6, 0.0], [0.3, 0.3]]]])
    gate = torch.tensor([[[0.0], [1.0]]])
    acc = GateAccumulator(info(), torch.tensor([5, 6]), min_count=1)
    acc.add(0, pattern, gate, torch.tensor([[5, 6]]))
    h = acc.tables()["heads"].iloc[0]
    assert h["mean_gate"] == pytest.approx(0.5)  # only row 1 counts (t >= 1)
    assert h["selectivity"] == pytest.approx(0.5)
    assert h["read_mean_gate"] == pytest.approx(0.5) and h["frac_below_half"] == pytest.approx(0.5)


def test_a_row_that_spends_nothing_on_the_real_keys_is_left_out_not_a_closed_gate():
    """softpick and stick-breaking rows may put no mass on the real keys (79% of layer 1's rows on probe/bb-softpick):
    their renormalised weights do not exist. They counted as m = 0 and selectivity 0, pulling mean_gate down (0.163
    where the rows that read anything give 0.655); they are left out of the sums and the counts (two heads here, one
    with an empty row)."""
    pattern = torch.zeros(1, 2, 3, 3)
    pattern[0, :, 1, :2] = torch.tensor([0.3, 0.3])  # row 1 of each head: w = (1/2, 1/2) over g = (0, 1)
    pattern[0, 0, 2, 2] = 0.5  # head 0's row 2 reads key 2 only; head 1's row 2 spends nothing
    gate = torch.tensor([[[0.0], [1.0], [0.8]]])
    acc = GateAccumulator(info(H=2, Hkv=1), torch.tensor([5, 6, 7]), min_count=1)
    acc.add(0, pattern, gate, torch.tensor([[5, 6, 7]]))
    heads = acc.tables()["heads"].set_index("head")
    assert heads.at[0, "mean_gate"] == pytest.approx((0.5 + 0.8) / 2)
    assert heads.at[1, "mean_gate"] == pytest.approx(0.5)  # its empty row 2 is no gate of 0
    assert heads.at[1, "selectivity"] == pytest.approx(0.5) and heads.at[1, "spread"] == pytest.approx(0.0, abs=1e-7)
    assert acc.batch_rows[0]["mean_gate"] == pytest.approx((0.5 + 0.8 + 0.5) / 3)


def test_spread_of_row_means():
    # rows 1 and 2 attend only to one key each: m_1 = g_1 = 0.2, m_2 = g_2 = 0.6; spread = std(0.2, 0.6) = 0.2
    pattern = torch.tensor([[[[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0]]]])
    gate = torch.tensor([[[0.9], [0.2], [0.6]]])
    acc = GateAccumulator(info(), torch.tensor([1, 2, 3]), min_count=1)
    acc.add(0, pattern, gate, torch.tensor([[1, 2, 3]]))
    h = acc.tables()["heads"].iloc[0]
    assert h["mean_gate"] == pytest.approx(0.4) and h["spread"] == pytest.approx(0.2)
    assert h["selectivity"] == pytest.approx(0.0, abs=1e-7)


def test_gqa_rows_use_their_own_kv_heads_gates():
    B, T = 1, 4
    gate = torch.stack([torch.full((B, T), 0.2), torch.full((B, T), 0.9)], -1)  # KV head 0: 0.2, KV head 1: 0.9
    acc = GateAccumulator(info(H=4, Hkv=2), torch.arange(T), min_count=1)
    acc.add(0, causal_uniform(B, 4, T), gate, torch.arange(T)[None])
    h = acc.tables()["heads"]
    assert h["mean_gate"].tolist() == pytest.approx([0.2, 0.2, 0.9, 0.9])
    assert h["kv_head"].tolist() == [0, 0, 1, 1]


def test_token_identity_share():
    B, T = 1, 8
    pattern = causal_uniform(B, 1, T)
    tokens = torch.tensor([[1, 2, 1, 2, 1, 2, 3, 3]])
    by_token = torch.tensor([[0.2, 0.8, 0.2, 0.8, 0.2, 0.8, 0.5, 0.5]])[..., None]  # a function of the token
    acc = GateAccumulator(info(), tokens.flatten(), min_count=3)
    acc.add(0, pattern, by_token, tokens)
    t = acc.tables()
    assert t["summary"]["token_share"].iloc[0] == pytest.approx(1.0)
    assert t["summary"]["token_share_min_count"].iloc[0] == pytest.approx(1.0)
    assert t["tokens"]["token_id"].tolist() == [1, 2]  # token 3 is seen twice < min_count; most attenuated first
    assert t["tokens"]["mean_gate"].tolist() == pytest.approx([0.2, 0.8])

    within = torch.tensor([[0.2, 0.2, 0.8, 0.8, 0.5, 0.5, 0.1, 0.9]])[..., None]  # every token averages 0.5
    acc = GateAccumulator(info(), tokens.flatten(), min_count=3)
    acc.add(0, pattern, within, tokens)
    assert acc.tables()["summary"]["token_share"].iloc[0] == pytest.approx(0.0, abs=1e-12)


def test_token_share_pools_sums_over_heads():
    tokens = torch.tensor([[1, 2, 1, 2]])
    gate = torch.stack(
        [
            torch.tensor([[0.0, 1.0, 0.0, 1.0]]),  # head 0: all variance between tokens (SS 1)
            torch.tensor([[0.4, 0.4, 0.6, 0.6]]),
        ],
        -1,
    )  # head 1: all within tokens (SS 0.04)
    acc = GateAccumulator(info(H=2, Hkv=2), tokens.flatten(), min_count=1)
    acc.add(0, causal_uniform(1, 2, 4), gate, tokens)
    assert acc.tables()["summary"]["token_share"].iloc[0] == pytest.approx(1.0 / 1.04)


def test_elementwise_gates_reduce_to_mean_per_read():
    B, T, dv = 1, 3, 4
    g = torch.rand(B, T, 1, dv, generator=torch.Generator().manual_seed(0))
    a, b = (GateAccumulator(info(), torch.arange(T), min_count=1) for _ in range(2))
    a.add(0, causal_uniform(B, 1, T), g, torch.arange(T)[None])
    b.add(0, causal_uniform(B, 1, T), g.mean(-1), torch.arange(T)[None])
    ta, tb = a.tables()["heads"], b.tables()["heads"]
    assert ta["mean_gate"].tolist() == pytest.approx(tb["mean_gate"].tolist())
    assert ta["selectivity"].tolist() == pytest.approx(tb["selectivity"].tolist())


def test_model_without_gate_raises():
    with pytest.raises(ValueError, match="no value gate"):
        gate_stats(tiny("baseline"), windows(1, 2, 8))


GATED = [(v, over) for v, over in every_variant() if tiny(v, **over).probe_info.has_value_gate]  # as they declare


@pytest.mark.parametrize("variant,over", GATED)
def test_gate_variants_run(variant, over):
    res = gate_stats(tiny(variant, **over), windows(1, 3, 12, vocab=8), min_count=2)
    s = res["summary"].iloc[0]
    for key in ("mean_gate", "selectivity", "spread", "read_mean_gate", "token_share"):
        assert torch.isfinite(torch.tensor(float(s[key]))), key
    assert 0 <= s["token_share"] <= 1 + 1e-9 and s["selectivity"] >= 0
    if variant in ("normgate", "projgate", "sink+norm", "routing-normgate", "gatedv", "g2"):  # sigmoid gates
        assert 0 <= s["mean_gate"] <= 1 and 0 <= s["frac_below_half"] <= 1
    assert len(res["tokens"]) > 0 and res["tokens"]["count"].min() >= 2


def test_model_numbers_match_a_brute_force_computation():
    model = tiny("normgate", n_kv_heads=2)
    toks = windows(1, 2, 10)
    res = gate_stats(model, toks, min_count=1)
    _, cache = model.run_with_cache(toks[0, :, :-1])
    for l in range(2):
        gate = cache[f"blocks.{l}.attn.hook_v_gate"]  # (B, T, Hkv)
        pattern = cache[f"blocks.{l}.attn.hook_pattern"]  # (B, H, T, T)
        w = pattern / pattern.sum(-1, keepdim=True)
        g = gate.permute(0, 2, 1).repeat_interleave(2, dim=1)  # (B, H, T)
        m = (w * g[:, :, None, :]).sum(-1)[:, :, 1:]
        sel = (w * (g[:, :, None, :] - (w * g[:, :, None, :]).sum(-1, keepdim=True)) ** 2).sum(-1).sqrt()[:, :, 1:]
        layer = res["layers"].iloc[l]
        assert layer["mean_gate"] == pytest.approx(float(m.mean()), rel=1e-5)
        assert layer["selectivity"] == pytest.approx(float(sel.mean()), rel=1e-4)
        assert layer["read_mean_gate"] == pytest.approx(float(gate.mean()), rel=1e-5)
        assert layer["frac_below_half"] == pytest.approx(float((gate < 0.5).float().mean()))


@pytest.mark.parametrize("variant,over", GATED)
def test_gate_statistics_equal_the_pattern_reference(variant, over):
    """The streamed statistics (one layer's pattern at a time, stopped early) equal the definitions computed from
    every layer's whole hook_pattern and hook_v_gate (tests.support.analyses.gate_reference, float64), for every
    gated variant: per head, per layer and the pooled token share."""
    model, toks = tiny(variant, **over), windows(2, 2, 12)
    got, ref = gate_stats(model, toks, min_count=1), gate_reference(model, toks)
    cols = ["mean_gate", "selectivity", "spread", "read_mean_gate", "frac_below_half"]
    for table, keys in (("heads", cols), ("layers", cols + ["token_share"])):
        a, b = got[table][keys].to_numpy(float), ref[table][keys].to_numpy(float)
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=1e-6, atol=1e-7, msg=table)
    assert got["summary"]["token_share"].iloc[0] == pytest.approx(ref["token_share"], rel=1e-6, abs=1e-7)
