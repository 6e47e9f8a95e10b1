"""DiffLlama under probe's hooks (probe.checkpoints.adapters.diffllama) on a tiny random config of transformers'
own class: parity with HF eager, the layers described as differential attention
(docs/definitions.md#differential-attention), the signed rows at their hooks against HF's λ computed by hand, their
streaming masses as shares of each row's absolute mass (docs/definitions.md#signed-rows), each branch's sink
statistics as its softmax rows', the hook algebra in fp64 and a padded batch.
"""

from __future__ import annotations

import math

import pytest
import torch

from probe.analyses.capture import row_mass_hooks, row_masses
from probe.checkpoints import algebra
from probe.hooks import names
from tests.support import parity


@pytest.fixture(scope="module")
def models():
    return parity.family_models("diffllama")


@pytest.fixture(scope="module")
def cached(models):
    _, m, _, _ = models
    with torch.no_grad():
        return m.run_with_cache(parity.ids())[1]


def test_logits_both_branches_and_a_value_edit_equal_hf_eager(models):
    parity.assert_parity(models)  # fp32 logits <= 1e-5, fp64 <= 1e-10, [p1, p2] = HF's weights, a hook_v edit


def test_every_layer_is_described_as_differential_attention(models):
    ref, m, _, _ = models
    info, config = m.probe_info, ref.config
    assert (info.n_heads, info.n_kv_heads) == (config.num_attention_heads // 2, config.num_key_value_heads // 2)
    for l in info.attention_layers:
        assert info.attention_at(l).rule == "diff"
    for point in ("lse", "phantom", "pattern_norm"):  # signed rows: none of these is defined
        assert info.lacks(names.attn(0, point)) is not None
    assert "hook_lambda" in row_mass_hooks(info)


def test_net_rows_are_the_branches_difference_under_hfs_lambda(models, cached):
    ref, m, _, _ = models
    for l, layer in enumerate(m.decoder_layers(m.hf_model)):
        attn = m.attention_module(layer)
        with torch.no_grad():  # HF's λ by hand: exp(λq1·λk1) − exp(λq2·λk2) + 0.8 − 0.6 exp(−0.3 l)
            lam = math.exp(float(attn.lambda_q1 @ attn.lambda_k1)) - math.exp(float(attn.lambda_q2 @ attn.lambda_k2))
        lam += 0.8 - 0.6 * math.exp(-0.3 * l)
        got = cached[names.attn(l, "lambda")]
        assert got.shape == (m.probe_info.n_heads,) and torch.allclose(got, torch.full_like(got, lam), atol=1e-6)
        p1, p2, net = (cached[names.attn(l, p)] for p in ("pattern_1", "pattern_2", "pattern"))
        assert torch.allclose(net, p1 - got[None, :, None, None] * p2, atol=1e-7)
        rows = net.sum(-1)
        assert torch.allclose(rows, (1 - got)[None, :, None].expand_as(rows), atol=1e-6)


def test_streaming_row_masses_are_shares_of_the_absolute_row(models, cached):
    """Masses on key 0, on two later keys and on every key, rebuilt from hook_rot_q / hook_rot_k (both branches)
    and hook_lambda, equal |a| / Σ|a| of hook_pattern; the row's mass is its signed sum 1 − λ."""
    _, m, _, _ = models
    info = m.probe_info
    indicators = torch.zeros(parity.B, parity.T, info.n_kv_heads, 3)  # B,Tk,Hkv,m
    indicators[:, 0, :, 0] = 1
    indicators[:, [2, 5], :, 1] = 1
    indicators[..., 2] = 1
    for l in info.attention_layers:
        got = {p: cached[names.attn(l, p)] for p in row_mass_hooks(info) if p != "hook_v"}
        net, mass, unspent = row_masses(info, l, got, indicators)
        pattern = cached[names.attn(l, "pattern")].abs()
        share = pattern / pattern.sum(-1, keepdim=True)
        assert torch.allclose(mass[..., 0], share[..., 0], atol=1e-6)
        assert torch.allclose(mass[..., 1], share[..., [2, 5]].sum(-1), atol=1e-6)
        assert torch.allclose(mass[..., 2], torch.ones_like(net), atol=1e-6)
        assert torch.allclose(net, cached[names.attn(l, "pattern")].sum(-1), atol=1e-6)
        assert not unspent.any()


def test_the_hook_algebra_holds_in_fp64(models):
    _, _, _, m64 = models
    with parity.fp64_throughout():
        errors, _ = algebra.check(m64, parity.ids())
    for rule in ("embed", "resid_mid", "resid_post", "unembed", "z", "scores", "result", "rot_q", "rot_k"):
        assert errors[rule] is not None and errors[rule] <= 1e-12, (rule, errors[rule])


def test_a_padded_batch_equals_hf_eager(models):
    """Left padding: the rows are taken under the dense mask (both branches masked alike)."""
    ref, m, _, _ = models
    x = parity.ids()
    mask = torch.ones_like(x)
    mask[0, :3] = 0
    with torch.no_grad():
        want, got = ref(x, attention_mask=mask).logits, m(x, attention_mask=mask).logits
    assert parity.max_diff(got[0, 3:], want[0, 3:]) <= 1e-5 and parity.max_diff(got[1], want[1]) <= 1e-5


def test_the_backcopy_split_reads_shares_of_the_absolute_row(models):
    """No phantom on signed rows: the split's key-0 mass on the rows t >= 2 is |a_t0| / Σ_j |a_tj|, its phantom 0."""
    from probe.analyses.backcopy import backcopy_split
    from probe.analyses.capture import as_windows

    _, m, _, _ = models
    data = parity.windows()[:1]  # (1, B, T+1)
    heads = backcopy_split(m, data, triggers=[-1])["heads"]  # no trigger: every row is "elsewhere"
    with torch.no_grad():
        _, cache = m.run_with_cache(as_windows(data).inputs(0), names_filter=lambda h: names.is_attn(h, "pattern"))
    for l in m.probe_info.attention_layers:
        a = cache[names.attn(l, "pattern")].double().abs()
        want = (a[..., 2:, 0] / a[..., 2:, :].sum(-1)).mean((0, 2))  # (H,)
        got = heads[heads["layer"] == l].sort_values("head")
        assert torch.allclose(torch.tensor(got["bos_elsewhere"].to_numpy()), want, atol=1e-6)
        assert (got["phantom_elsewhere"] == 0).all()


def test_a_cached_decoding_step_equals_the_full_forward(models):
    """The step after a prefill reads the cached keys and both value halves (a dense mask with a cache offset)."""
    ref, m, _, _ = models
    x = parity.ids()
    with torch.no_grad():
        prefill = m.hf_model(x[:, :-1], use_cache=True)
        step = m.hf_model(x[:, -1:], cache=prefill.past_key_values, use_cache=True).logits
        want = ref(x).logits[:, -1:]
    assert parity.max_diff(step, want) <= 1e-5


def test_sink_tables_report_each_branch_as_its_softmax_rows(models):
    """pos0_share_1 / _2 (sink statistics) and key0_mass_1 / _2 (Sink^ε), streamed from hook_rot_q / hook_rot_k,
    equal key 0's share of hook_pattern_1 / hook_pattern_2 over rows t >= 1, per head
    (docs/definitions.md#signed-rows)."""
    from probe.analyses.capture import as_windows
    from probe.analyses.sink_heads import sink_heads
    from probe.analyses.sinks import sink_stats

    _, m, _, _ = models
    data = parity.windows()[:1]  # (1, B, T+1)
    heads = sink_stats(m, data)["heads"].sort_values(["layer", "head"])
    eps = sink_heads(m, data)["heads"].sort_values(["layer", "head"])
    with torch.no_grad():
        _, cache = m.run_with_cache(
            as_windows(data).inputs(0), names_filter=lambda h: names.is_attn(h, "pattern_1", "pattern_2")
        )
    for b in (1, 2):
        want = torch.stack(
            [
                (p := cache[names.attn(l, f"pattern_{b}")].double())[..., 1:, 0].div(p[..., 1:, :].sum(-1)).mean((0, 2))
                for l in m.probe_info.attention_layers
            ]
        ).flatten()  # (L·H,)
        for got in (heads[f"pos0_share_{b}"], eps[f"key0_mass_{b}"]):
            assert torch.allclose(torch.tensor(got.to_numpy()), want, atol=1e-6, rtol=0)
