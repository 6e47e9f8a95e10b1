"""DeepSeek-V4 under probe's hooks (probe.checkpoints.adapters.deepseek_v4) on a tiny random config of transformers'
own class: parity with HF eager, its attention described as what it runs (a sliding window and a learned sink in every
layer), the hyper-connection streams' rules, the routers' hooks, and the one-line refusal of compressed KV entries.

The coverage table refuses the type: its tiny config keeps the default compress rates (4 and 128), and a 12-token
test sequence closes compressed-sparse windows. Here the rates are raised above the test length (16 and 32), so the
compressors run and emit nothing and every other part of the model is checked.
"""

from __future__ import annotations

import copy

import pytest
import torch

from probe.checkpoints import algebra
from probe.checkpoints.adapters import adapt
from probe.checkpoints.adapters.deepseek_v4 import CompressedKeysError
from probe.checkpoints.tiny import tiny_model
from probe.hooks import names
from tests.support import parity

LONG_RATES = {"compress_rates": {"compressed_sparse_attention": 16, "heavily_compressed_attention": 32}}


@pytest.fixture(scope="module")
def models():
    return parity.family_models("deepseek_v4", LONG_RATES)


def test_logits_patterns_and_a_value_edit_equal_hf_eager(models):
    parity.assert_parity(models)  # fp32 logits <= 1e-5, fp64 <= 1e-10, patterns and a hook_v edit <= 1e-5


def test_every_layer_is_described_as_the_window_and_sink_it_runs(models):
    ref, m, _, _ = models
    config, info = ref.config, m.probe_info
    assert config.layer_types == ["heavily_compressed_attention", "compressed_sparse_attention"]
    for l in range(info.n_layers):
        rules = info.attention_at(l)
        assert (rules.mask, rules.window, rules.phantom) == ("sliding", config.sliding_window, True)
    x = parity.ids()
    _, cache = m.run_with_cache(x)
    attn = m.attention_module(m.decoder_layers(ref)[0])
    assert torch.equal(cache[names.attn(0, "sink_logit")], attn.sinks)
    pattern = cache[names.attn(0, "pattern")]  # keys further back than the window get nothing
    i, j = torch.meshgrid(torch.arange(parity.T), torch.arange(parity.T), indexing="ij")
    assert pattern[..., (i - j) >= config.sliding_window].abs().max() == 0
    rows = pattern.sum(-1) + cache[names.attn(0, "phantom")]
    assert torch.allclose(rows, torch.ones_like(rows), atol=1e-6)


def test_the_stream_rules_hold_in_fp64_and_the_weights_are_the_papers(models):
    _, _, _, m64 = models
    with parity.fp64_throughout():
        errors, _ = algebra.check(m64, parity.ids())
    for rule in ("embed", "resid_mid", "resid_post", "unembed", "z", "scores"):
        assert errors[rule] <= 1e-12, (rule, errors[rule])
    _, cache = m64.run_with_cache(parity.ids())
    n = m64.probe_info.extra["hc_streams"]
    first = cache[names.streams(0)]  # every stream starts as the token embedding
    assert first.shape[-2] == n and torch.equal(first, cache[names.EMBED][:, :, None].expand_as(first))
    eps = m64.hf_model.config.hc_eps
    for l in range(m64.probe_info.n_layers):
        for site in ("attn", "mlp"):
            pre, post, res = (cache[names.hc(l, site, p)] for p in ("pre", "post", "res"))
            assert bool(((pre > eps) & (pre < 1 + 2 * eps)).all()) and bool(((post > 0) & (post < 2)).all())
            # res is out × in: Sinkhorn's last step normalises HF's columns, the hook's rows: they sum to 1 (up to
            # eps); the columns nearly so after 20 rounds
            assert torch.allclose(res.sum(-1), torch.ones_like(post), atol=1e-5)
            assert torch.allclose(res.sum(-2), torch.ones_like(post), atol=1e-3)


def test_an_edit_of_the_stream_sum_is_shared_by_the_streams(models):
    """Adding δ to resid_mid is adding δ/N to every stream of hook_streams_mid, and it moves the logits."""
    _, m, _, _ = models
    x, n = parity.ids(), m.probe_info.extra["hc_streams"]
    delta = torch.randn(m.probe_info.d_model, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        base = m(x).logits
        on_sum = m.run_with_hooks(x, fwd_hooks=[(names.resid(0, "mid"), lambda t, hook: t + delta)])
        on_streams = m.run_with_hooks(x, fwd_hooks=[(names.streams(0, "mid"), lambda t, hook: t + delta / n)])
    assert parity.max_diff(on_sum, base) > 1e-3
    assert parity.max_diff(on_sum, on_streams) <= 1e-5


def test_routers_fire_the_vocabularys_points(models):
    ref, m, _, _ = models
    x = parity.ids()
    _, cache = m.run_with_cache(x)
    layers = m.decoder_layers(ref)
    assert ref.config.mlp_layer_types == ["hash_moe", "moe"]
    table = layers[0].mlp.gate.tid2eid  # hash routing: the experts are the token's row of the table
    assert torch.equal(cache[names.mlp(0, "expert_indices")], table[x])
    weights = cache[names.mlp(1, "expert_weights")]  # B,T,E: k experts per token, summing to the scaling factor
    assert torch.equal((weights > 0).sum(-1), torch.full(x.shape, ref.config.num_experts_per_tok))
    scale = torch.full(x.shape, ref.config.routed_scaling_factor)
    assert torch.allclose(weights.sum(-1), scale, atol=1e-5)


def test_compressed_entries_stop_the_forward_in_one_line():
    ref = tiny_model("deepseek_v4")  # the default rates: compressed-sparse windows of 4 tokens
    m = adapt(copy.deepcopy(ref))
    with pytest.raises(CompressedKeysError, match=r"layer 1 \(compressed_sparse_attention\).*shorter than 4") as e:
        m(parity.ids())
    assert "\n" not in str(e.value)
    short = parity.ids()[:, :3]  # no window closes: the model runs, equal to HF
    with torch.no_grad():
        assert parity.max_diff(m(short).logits, ref(short).logits) <= 1e-5
