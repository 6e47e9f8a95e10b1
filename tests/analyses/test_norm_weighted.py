"""Norm-weighted attention (docs/definitions.md#norm-weighted-attention): hook_pattern_norm and the head-summed
norms against the authors' own BertNormOutput (tests/fixtures/norm_weighted/make_golden.py), the hook against a
by-hand computation on a tiny model (grouped-query attention included), the key-0 shares against a by-hand average,
the invariant that equal transformed norms leave the share unchanged, and the part's place in the `probe sinks` pass."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from probe.analyses.norm_weighted import key0_parts, norm_weighted, summed_pattern_norms
from probe.analyses.sink_pass import sink_analyses
from probe.hooks import names
from probe.kernels.sink_attention.reference import pattern_norms
from tests.support.analyses import tiny, windows
from tests.support.cli import WINDOWS, probe

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "norm_weighted" / "golden.safetensors"


@pytest.fixture(scope="module")
def golden():
    return load_file(str(GOLDEN))


def test_pattern_norms_equal_the_authors_weighted_norms(golden):
    got = pattern_norms(golden["pattern"], golden["v"], golden["w_out"])
    assert got.dtype == torch.float64
    assert (got - golden["weighted_norm"]).abs().max() <= 1e-12
    # a pattern of ones gives each key's ||f_h(v_j)||, the authors' transformed_norm
    ones = torch.ones_like(golden["pattern"])
    assert (
        pattern_norms(ones, golden["v"], golden["w_out"])[:, :, 0] - golden["transformed_norm"]
    ).abs().max() <= 1e-12


def test_summed_pattern_norms_equal_the_authors_head_summed_norms(golden):
    got = summed_pattern_norms(golden["pattern"], golden["v"], golden["w_out"], block=4)  # blocks cut the rows
    assert (got - golden["summed_norm"]).abs().max() <= 1e-12


def test_a_small_value_at_key_0_takes_less_of_the_norm_than_of_the_weight(golden):
    got = key0_parts(golden["pattern"], golden["weighted_norm"])
    assert (got["norm_share"][..., 1:] < got["share"][..., 1:]).all()  # the fixture's v_0 is 0.05 times a draw


@torch.no_grad()
@pytest.mark.parametrize("variant,over", [("baseline", {}), ("sinklogit", {"n_kv_heads": 2})])
def test_hook_pattern_norm_equals_a_by_hand_computation(variant, over):
    model = tiny(variant, **over)
    ids = windows(1, 2, 7)[0, :, :-1]
    _, cache = model.run_with_cache(ids, names_filter=lambda n: names.is_attn(n, "pattern", "pattern_norm", "v_out"))
    info = model.probe_info
    G, dv = info.kv_group, model.blocks[0].attn.d_value
    for l in range(info.n_layers):
        pat, v = cache[names.attn(l, "pattern")].double(), cache[names.attn(l, "v_out")].double()
        got = cache[names.attn(l, "pattern_norm")]
        w = model.blocks[l].attn.o_proj.weight.double()  # d, H*dv
        B, H, T, _ = pat.shape
        for b in range(B):
            for h in range(H):
                w_h = w[:, h * dv : (h + 1) * dv]
                for i in range(T):
                    for j in range(T):
                        want = (pat[b, h, i, j] * (w_h @ v[b, j, h // G])).norm()
                        assert float(got[b, h, i, j]) == pytest.approx(float(want), rel=1e-5, abs=1e-7)


def test_equal_transformed_norms_leave_the_share_unchanged():
    g = torch.Generator().manual_seed(0)
    B, H, T, dv = 2, 3, 6, 4
    scores = torch.randn(B, H, T, T, generator=g, dtype=torch.float64)
    pattern = scores.masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool)), float("-inf")).softmax(-1)
    v = torch.randn(B, T, H, dv, generator=g, dtype=torch.float64)
    v = 2.5 * v / v.norm(dim=-1, keepdim=True)  # every value of norm 2.5
    q, _ = torch.linalg.qr(torch.randn(H * dv, H * dv, generator=g, dtype=torch.float64))  # orthogonal W_O
    got = key0_parts(pattern, pattern_norms(pattern, v, q))
    assert torch.allclose(got["norm_share"], got["share"], rtol=0, atol=1e-12)
    assert not torch.allclose(got["share"][..., 1:], torch.ones(B, H, T - 1, dtype=torch.float64))


@torch.no_grad()
def test_streamed_shares_equal_a_by_hand_average_of_the_captured_rows():
    model, w = tiny("sinklogit"), windows(2, 2, 8)
    want: dict[tuple[int, int], list[float]] = {}
    for ids in w[..., :-1]:
        _, cache = model.run_with_cache(ids, names_filter=lambda n: names.is_attn(n, "pattern", "pattern_norm"))
        for l in range(model.probe_info.n_layers):
            pat, nrm = cache[names.attn(l, "pattern")].double(), cache[names.attn(l, "pattern_norm")].double()
            for h in range(pat.shape[1]):
                s = want.setdefault((l, h), [0.0, 0.0, 0.0, 0.0, 0])
                for b in range(pat.shape[0]):
                    for t in range(1, pat.shape[2]):
                        s[0] += float(pat[b, h, t, 0] / pat[b, h, t].sum())
                        s[1] += float(nrm[b, h, t, 0] / nrm[b, h, t].sum())
                        s[2] += float(nrm[b, h, t, 0])
                        s[3] += float(nrm[b, h, t].sum())
                        s[4] += 1
    heads = norm_weighted(model, w)["heads"]
    for _, r in heads.iterrows():
        share, norm_share, key0_norm, row_norm, n = want[(int(r["layer"]), int(r["head"]))]
        assert r["share"] == pytest.approx(share / n, abs=1e-6)
        assert r["norm_share"] == pytest.approx(norm_share / n, abs=1e-6)
        assert r["key0_norm"] == pytest.approx(key0_norm / n, rel=1e-6)
        assert r["row_norm"] == pytest.approx(row_norm / n, rel=1e-6)
        assert r["ratio"] == pytest.approx(r["norm_share"] / r["share"], rel=1e-12)


def test_a_row_without_weight_has_no_share():
    pattern = torch.zeros(1, 1, 3, 3)
    pattern[0, 0, 2, :2] = torch.tensor([0.25, 0.5])
    got = key0_parts(pattern, pattern)
    assert got["share"][0, 0, 1].isnan() and float(got["share"][0, 0, 2]) == pytest.approx(1 / 3)


def test_hook_pattern_norm_is_computed_only_when_asked(monkeypatch):
    import probe.models.attention as attention

    def refuse(*a, **k):
        raise AssertionError("hook_pattern_norm computed on a forward that asked for none")

    monkeypatch.setattr(attention, "pattern_norms", refuse)
    model, ids = tiny("baseline"), windows(1, 1, 6)[0, :, :-1]
    model(ids)
    model.run_with_cache(ids, names_filter=lambda n: names.is_attn(n, "pattern"))


def test_norm_weighted_in_the_shared_pass_equals_alone_and_changes_nothing_else():
    model, w = tiny("sinklogit"), windows(2, 2, 10)
    plain = sink_analyses(model, w)
    both = sink_analyses(model, w, entropy=True, norm_weighted=True)
    alone = norm_weighted(model, w)
    for k in ("heads", "layers", "summary"):
        pd.testing.assert_frame_equal(both["norm_weighted"][k], alone[k])
        pd.testing.assert_frame_equal(both["sinks"][k], plain["sinks"][k])


@torch.no_grad()
# learned sinks and GQA, a value bias, GPT-2's Conv1D W_O, Gemma 2's soft-capped attention function
@pytest.mark.parametrize("family", ["gpt_oss", "qwen2", "gpt2", "gemma2"])
def test_hook_pattern_norm_on_hf_checkpoints_equals_the_pattern_times_each_heads_write_norm(family, tmp_path):
    import probe
    from probe.checkpoints.tiny import VOCAB, build_tiny

    model = probe.load(build_tiny(family, tmp_path / family))
    ids = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(0))
    _, cache = model.run_with_cache(ids, names_filter=lambda n: names.is_attn(n, "pattern", "pattern_norm", "v_out"))
    info = model.probe_info
    for l in info.attention_layers:
        pat, v = cache[names.attn(l, "pattern")].double(), cache[names.attn(l, "v_out")].double()
        out = model.blocks[l].attn.out_proj
        w = (out.weight if isinstance(out, torch.nn.Linear) else out.weight.T).double()  # d, H*dv
        dv = v.shape[-1]
        for h in range(info.n_heads):
            f = v[:, :, h // info.kv_group] @ w[:, h * dv : (h + 1) * dv].T  # B,T,d: each key's write through head h
            want = pat[:, h] * f.norm(dim=-1)[:, None, :]
            assert torch.allclose(cache[names.attn(l, "pattern_norm")][:, h].double(), want, rtol=1e-4, atol=1e-6)


def test_sinks_norm_weighted_writes_its_csvs_and_lines(tmp_path):
    out = tmp_path / "nw"
    r = probe("sinks", "--model", "probe/tiny-baseline", *WINDOWS, "--norm-weighted", "--out", out)
    assert r.returncode == 0, r.stderr
    assert "key 0's share by weight and by norm" in r.stdout
    for name in ("summary", "layers", "heads", "batches"):
        assert (out / f"sinks_norm_weighted_{name}.csv").is_file(), name
    layers = pd.read_csv(out / "sinks_norm_weighted_layers.csv")
    assert len(layers) == 6 and layers[["share", "norm_share"]].gt(0).all().all()
    assert layers[["share", "norm_share"]].lt(1).all().all()
    assert "norm_weighted_heads" in json.loads((out / "sinks.json").read_text())["tables"]


def test_norm_weighted_takes_one_context():
    args = ("--model", "probe/tiny-baseline", "--batches", "1", "--batch-size", "1", "--ctx", "8", "16")
    r = probe("sinks", *args, "--norm-weighted")
    assert r.returncode == 2 and "--norm-weighted takes one --ctx" in r.stderr


def test_a_model_without_hook_pattern_norm_is_refused_in_one_line(tmp_path):
    """Differential attention fires no hook_pattern_norm (the norm after the difference is not linear): --norm-weighted
    on it was an internal error (exit 1); it is one line naming the hook, exit 2, nothing written."""
    out = tmp_path / "nw"
    r = probe("sinks", "--model", "probe/bb-diff", *WINDOWS, "--norm-weighted", "--out", out)
    error = r.stderr.strip().splitlines()[-1]  # after the plan's note
    assert r.returncode == 2 and error.startswith("probe sinks: error: model 'probe/bb-diff' cannot run"), r.stderr
    assert "it needs blocks.0.attn.hook_pattern_norm" in error
    assert not out.exists()
