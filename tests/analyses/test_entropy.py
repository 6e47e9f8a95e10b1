"""Attention entropy per head (docs/definitions.md#attention-entropy): the streamed analysis against a by-hand
computation on a tiny model's captured patterns, the invariants of its normalisation (uniform rows 1, one-hot rows 0,
under a causal mask, a sliding window and a phantom), and its place in the shared `probe sinks` pass."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

import probe
from probe.analyses.entropy import EntropyAccumulator, attention_entropy, counted_rows, row_entropies
from probe.analyses.sink_pass import sink_analyses
from probe.checkpoints.tiny import VOCAB, build_tiny
from probe.hooks import LayerAttention, names
from probe.hooks.info import ModelInfo
from probe.kernels.row_rules import ROW_RULES
from tests.support.analyses import tiny, windows


def hand_info(L=1, H=2, layer_types=None, window=None):
    return ModelInfo(
        name="hand",
        family="test",
        n_layers=L,
        d_model=8,
        n_heads=H,
        n_kv_heads=H,
        d_head=4,
        n_ctx=16,
        vocab_size=10,
        layer_types=layer_types or [],
        sliding_window=window,
    )


def visible_keys(T, window=None, chunk=None):
    """The keys each row sees, by the one rule (LayerAttention.visible_keys) of a full, sliding or chunked layer."""
    mask = "sliding" if window else "chunked" if chunk else "full"
    return LayerAttention(rule="softmax", mask=mask, scale=1.0, window=window, chunk=chunk).visible_keys(T)


def causal_uniform(B, H, T, window=None, mass=1.0):
    """Rows uniform over their visible keys, each row's real mass ``mass``."""
    t = torch.arange(T)
    seen = (t[None, :] <= t[:, None]) & ((t[:, None] - t[None, :] < window) if window else True)
    p = seen.double() / seen.sum(-1, keepdim=True)
    return (mass * p).expand(B, H, T, T).clone()


@torch.no_grad()
def by_hand(model, tokens):
    """Per (layer, head) mean over rows t >= 1 and every window of -sum_j a log a - p log p, and of it over
    log(visible keys [+ 1 with a phantom]) (t + 1 keys, min(t + 1, w) in a sliding layer), from whole captured
    patterns, one row at a time in float64. Under a row rule the unspent mass (hook_phantom) is the one more outcome
    where rows sum to at most one; where they may sum past one each row's shares a / sum a are its distribution."""
    info = model.probe_info
    rule = ROW_RULES.get(info.attention_rule)
    unspent = info.has_phantom or (rule is not None and rule.at_most_one)
    shares = rule is not None and not rule.at_most_one
    windows_of = {l: info.sliding_window for l, kind in enumerate(info.layer_types) if kind == "sliding"}
    sums = {}
    rows = 0
    for ids in tokens[..., :-1]:
        _, cache = model.run_with_cache(ids, names_filter=lambda n: names.is_attn(n, "pattern", "phantom"))
        B, T = ids.shape
        rows += B * (T - 1)
        for l in range(info.n_layers):
            pat = cache[names.attn(l, "pattern")].double()
            ph = cache[names.attn(l, "phantom")].double() if unspent else None
            for h in range(info.n_heads):
                raw = norm = 0.0
                for b in range(B):
                    for t in range(1, T):
                        a = pat[b, h, t, : t + 1]
                        a = a / a.sum() if shares else a
                        a = a[a > 0]
                        e = float(-(a * a.log()).sum())
                        outcomes = min(t + 1, w) if (w := windows_of.get(l)) else t + 1
                        if ph is not None:
                            p = max(float(ph[b, h, t]), 0.0)  # a normalised rule's 1 - sum rounds to -1e-7
                            e -= p * math.log(p) if p > 0 else 0.0
                            outcomes += 1
                        raw += e
                        norm += e / math.log(outcomes)
                s = sums.setdefault((l, h), [0.0, 0.0])
                s[0] += raw
                s[1] += norm
    return {k: (v[0] / rows, v[1] / rows) for k, v in sums.items()}


@pytest.mark.parametrize("variant", ["baseline", "sinklogit", "softpick", "sigmoid", "elu1-norm"])
def test_streamed_entropy_equals_the_by_hand_computation(variant):
    model, w = tiny(variant), windows(2, 2, 10)
    want = by_hand(model, w)
    heads = attention_entropy(model, w)["heads"]
    for _, r in heads.iterrows():
        raw, norm = want[(int(r["layer"]), int(r["head"]))]
        assert r["entropy"] == pytest.approx(raw, abs=1e-5)
        assert r["entropy_norm"] == pytest.approx(norm, abs=1e-5)
    if variant == "baseline":  # no phantom: the real keys' entropy is the entropy
        assert (heads["entropy_real_norm"] - heads["entropy_norm"]).abs().max() < 1e-6


def test_streamed_entropy_equals_the_by_hand_computation_in_a_sliding_window_checkpoint(tmp_path):
    model = probe.load(build_tiny("gemma2", tmp_path / "gemma2"))  # layer 0 slides over 4 keys, layer 1 is full
    assert model.probe_info.layer_types[0] == "sliding" and model.probe_info.sliding_window == 4
    w = torch.randint(0, VOCAB, (2, 2, 13), generator=torch.Generator().manual_seed(0))
    want = by_hand(model, w)
    for _, r in attention_entropy(model, w)["heads"].iterrows():
        raw, norm = want[(int(r["layer"]), int(r["head"]))]
        assert r["entropy"] == pytest.approx(raw, abs=1e-5)
        assert r["entropy_norm"] == pytest.approx(norm, abs=1e-5)


def test_layer_and_summary_means_and_their_batch_standard_errors():
    model, w = tiny("baseline"), windows(3, 2, 8)
    r = attention_entropy(model, w)
    heads, layers, batches = r["heads"], r["layers"], r["batches"]
    for _, row in layers.iterrows():
        sub = heads[heads["layer"] == row["layer"]]
        assert row["entropy_norm"] == pytest.approx(sub["entropy_norm"].mean(), abs=1e-12)
        per_batch = batches[batches["layer"] == row["layer"]].groupby("batch")["entropy_norm"].mean()
        assert row["entropy_norm_se"] == pytest.approx(per_batch.std(ddof=1) / math.sqrt(3), abs=1e-12)
    one = batches[(batches["layer"] == 0) & (batches["head"] == 1)]["entropy"]
    h01 = heads[(heads["layer"] == 0) & (heads["head"] == 1)].iloc[0]
    assert h01["entropy"] == pytest.approx(one.mean(), abs=1e-12)  # equal batches: pooled = mean of batch means
    assert h01["entropy_se"] == pytest.approx(one.std(ddof=1) / math.sqrt(3), abs=1e-12)
    assert r["summary"]["entropy_norm"].iloc[0] == pytest.approx(layers["entropy_norm"].mean(), abs=1e-12)
    low = heads.loc[heads["entropy_norm"].idxmin()]
    s = r["summary"].iloc[0]
    assert (s["min_head_layer"], s["min_head"]) == (low["layer"], low["head"])


@pytest.mark.parametrize("window", [None, 3])
def test_uniform_rows_have_normalised_entropy_one(window):
    T = 9
    n = visible_keys(T, window)
    got = row_entropies(causal_uniform(2, 3, T, window), visible=n)
    keep = counted_rows(n)
    assert torch.allclose(got["entropy_norm"][..., keep], torch.ones(2, 3, int(keep.sum()), dtype=torch.float64))
    assert torch.allclose(got["entropy"][0, 0], n.log())  # nats: log of the visible keys
    assert got["entropy_norm"][..., 0].isnan().all()  # row 0 sees one key: no normaliser


def test_uniform_over_keys_and_phantom_is_one_and_the_real_share_alone_is_one_too():
    T = 7
    n = visible_keys(T)
    mass = (n / (n + 1))[:, None]  # real keys take (t+1)/(t+2): every outcome 1/(t+2)
    got = row_entropies(causal_uniform(1, 2, T, mass=mass), (1 / (n + 1)).expand(1, 2, T))
    assert torch.allclose(got["entropy_norm"][..., 1:], torch.ones(1, 2, T - 1, dtype=torch.float64))
    assert torch.allclose(got["entropy_real_norm"][..., 1:], torch.ones(1, 2, T - 1, dtype=torch.float64))
    # a phantom that takes every row whole: entropy 0; no real mass left to spread
    none = row_entropies(torch.zeros(1, 1, T, T), torch.ones(1, 1, T))
    assert (none["entropy"] == 0).all() and (none["entropy_norm"][..., 1:] == 0).all()


def test_one_hot_rows_have_entropy_zero():
    T = 8
    pattern = torch.zeros(2, 2, T, T)
    pattern[..., 0] = 1  # every row on key 0 (a perfect sink)
    got = row_entropies(pattern)
    assert (got["entropy"] == 0).all() and (got["entropy_norm"][..., 1:] == 0).all()
    pattern = torch.eye(T).expand(1, 1, T, T)  # every row on itself
    assert (row_entropies(pattern)["entropy_norm"][..., 1:] == 0).all()


def test_sliding_window_rows_are_normalised_by_their_visible_keys():
    T, w = 8, 3
    info = hand_info(layer_types=["sliding"], window=w)
    acc = EntropyAccumulator(info)
    acc.add(0, causal_uniform(2, 2, T, window=w))
    t = acc.tables()
    assert t["heads"]["entropy_norm"].tolist() == pytest.approx([1.0, 1.0], abs=1e-12)
    raw = float(sum(math.log(min(i + 1, w)) for i in range(1, T)) / (T - 1))
    assert t["heads"]["entropy"].tolist() == pytest.approx([raw, raw], abs=1e-12)


def test_chunked_rows_at_a_chunk_start_are_left_out():
    keep = counted_rows(visible_keys(8, chunk=4))
    assert keep.tolist() == [False, True, True, True, False, True, True, True]
    assert visible_keys(8, chunk=4).tolist() == [1, 2, 3, 4, 1, 2, 3, 4]


def test_entropy_in_the_shared_pass_equals_alone_and_changes_nothing_else():
    model, w = tiny("sinklogit"), windows(2, 2, 10)
    plain = sink_analyses(model, w)
    both = sink_analyses(model, w, entropy=True, kurtosis=True)
    alone = attention_entropy(model, w)
    for k in ("heads", "layers", "summary"):
        pd.testing.assert_frame_equal(both["entropy"][k], alone[k])
    for k in ("heads", "layers", "summary"):
        pd.testing.assert_frame_equal(both["sinks"][k], plain["sinks"][k])
        pd.testing.assert_frame_equal(both["sink_eps"][k], plain["sink_eps"][k])
