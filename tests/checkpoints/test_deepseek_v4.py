"""DeepSeek-V4 under probe's hooks (probe.checkpoints.adapters.deepseek_v4) on a tiny random config of transformers'
own class at its default compress rates (4 and 128, so the 12-token test sequence closes three compressed-sparse
windows in layer 1): parity with HF eager, its attention described as what it runs (a sliding window, a learned sink
and compressed KV entries after the token keys, docs/definitions.md#compressed-keys), the streaming row masses and a
knockout on those entries, the hyper-connection streams' rules and the routers' hooks.
"""

from __future__ import annotations

import copy

import pytest
import torch

from probe.analyses.capture import row_mass_hooks, row_masses
from probe.analyses.interventions.knockout import hand_over
from probe.checkpoints import algebra
from probe.hooks import names
from probe.kernels.sink_attention import edits
from tests.support import parity

CSA, HCA = 1, 0  # the tiny config's layer types: heavily compressed (rate 128), then compressed sparse (rate 4)


@pytest.fixture(scope="module")
def models():
    return parity.family_models("deepseek_v4")


def test_logits_patterns_and_a_value_edit_equal_hf_eager(models):
    parity.assert_parity(models)  # fp32 logits <= 1e-5, fp64 <= 1e-10, patterns and a hook_v edit <= 1e-5


def test_every_layer_is_described_as_the_window_sink_and_entries_it_runs(models):
    ref, m, _, _ = models
    config, info = ref.config, m.probe_info
    assert config.layer_types == ["heavily_compressed_attention", "compressed_sparse_attention"]
    for l, kind in enumerate(config.layer_types):
        rules = info.attention_at(l)
        assert (rules.mask, rules.window, rules.phantom) == ("sliding", config.sliding_window, True)
        assert rules.compress_rate == config.compress_rates[kind]
        assert rules.compress_topk == (config.index_topk if l == CSA else None)
    x = parity.ids()
    _, cache = m.run_with_cache(x)
    attn = m.attention_module(m.decoder_layers(ref)[0])
    assert torch.equal(cache[names.attn(0, "sink_logit")], attn.sinks)
    assert cache[names.attn(HCA, "compressed_kv")].shape[1] == 0  # 12 tokens close no window of 128
    for l in (HCA, CSA):
        rules = info.attention_at(l)
        pattern = cache[names.attn(l, "pattern")]  # B,H,T,T+C
        C = rules.compressed_entries(parity.T)
        assert pattern.shape[-1] == parity.T + C == parity.T + cache[names.attn(l, "compressed_kv")].shape[1]
        i, j = torch.meshgrid(torch.arange(parity.T), torch.arange(parity.T), indexing="ij")
        assert pattern[..., : parity.T][..., (i - j) >= config.sliding_window].abs().max() == 0
        t, w = torch.meshgrid(torch.arange(parity.T), torch.arange(C), indexing="ij")
        entries = pattern[..., parity.T :]  # entry w is seen once its window has closed: w < (t + 1) // rate
        assert entries[..., w >= (t + 1) // rules.compress_rate].abs().sum() == 0
        seen = (pattern > 0).sum(-1).double()  # the keys each row puts weight on: the description's count
        assert torch.equal(seen, rules.visible_keys(parity.T).expand_as(seen))
        rows = pattern.sum(-1) + cache[names.attn(l, "phantom")]
        assert torch.allclose(rows, torch.ones_like(rows), atol=1e-6)


def test_entry_columns_share_the_rows_normaliser(models):
    """An entry's weight is exp(scale · rot_q·entry − L) with L = logaddexp(hook_lse, sink): hook_lse's normaliser
    holds the token keys and the entries, the pattern's last C columns are the entries of hook_compressed_kv."""
    _, _, _, m64 = models
    with parity.fp64_throughout():
        _, cache = m64.run_with_cache(parity.ids())
    rules = m64.probe_info.attention_at(CSA)
    q, e = cache[names.rot(CSA, "q")], cache[names.attn(CSA, "compressed_kv")]  # B,T,H,dh; B,C,1,dh
    whole = torch.logaddexp(cache[names.attn(CSA, "lse")], cache[names.attn(CSA, "sink_logit")][None, :, None])
    by_hand = torch.exp(rules.scale * torch.einsum("bthd,bcd->bhtc", q, e[:, :, 0]) - whole[..., None])
    entries = cache[names.attn(CSA, "pattern")][..., parity.T :]
    seen = entries > 0
    assert seen.any() and torch.allclose(entries[seen], by_hand[seen], rtol=1e-10, atol=0)


def test_streaming_row_masses_equal_the_pattern_on_a_compressed_layer(models):
    """Masses on key 0, on two later keys and on every key, rebuilt from hook_rot_q / hook_rot_k and hook_lse, equal
    the pattern's token columns; the every-key column holds the entries too (1 − phantom)."""
    _, m, _, _ = models
    info = m.probe_info
    _, cache = m.run_with_cache(parity.ids())
    got = {p: cache[names.attn(CSA, p)] for p in row_mass_hooks(info) if p != "hook_v"}
    indicators = torch.zeros(parity.B, parity.T, info.n_kv_heads, 3)  # B,Tk,Hkv,m
    indicators[:, 0, :, 0] = 1
    indicators[:, [2, 5], :, 1] = 1
    indicators[..., 2] = 1
    _, mass, phantom = row_masses(info, CSA, got, indicators)
    pattern = cache[names.attn(CSA, "pattern")]
    assert torch.allclose(phantom, cache[names.attn(CSA, "phantom")], atol=1e-6)
    assert torch.allclose(mass[..., 0], pattern[..., 0], atol=1e-6)
    assert torch.allclose(mass[..., 1], pattern[..., [2, 5]].sum(-1), atol=1e-6)
    assert torch.allclose(mass[..., 2], 1 - phantom, atol=1e-6)
    assert float(pattern[..., parity.T :].sum(-1).max()) > 1e-3  # the entries hold mass the token columns lack


def test_a_knockout_removes_key_0_and_renormalises_the_entries_too(models):
    """Knocking key 0 out of the compressed layer: column 0 is empty in rows t >= 1 and every other column (token or
    entry) and the phantom are the clean row over 1 − its key-0 weight; the fused path gives the same logits."""
    _, m, _, _ = models
    x = parity.ids()
    _, clean = m.run_with_cache(x, names_filter=lambda n: names.is_attn(n, "pattern", "phantom"))
    edit = edits.AttentionEdit(knockout=True)
    hooks = [(names.attn(CSA, "v_out"), hand_over(edit))]
    with m.hooks(fwd_hooks=hooks), edits.carried(m):
        out, cut = m.run_with_cache(x, names_filter=lambda n: names.is_attn(n, "pattern", "phantom"))
    with torch.no_grad(), m.hooks(fwd_hooks=hooks), edits.carried(m):  # the fused path, no pattern: the same edit
        assert parity.max_diff(m(x).logits, out) <= 1e-5
    p0, p1 = clean[names.attn(CSA, "pattern")][..., 1:, :], cut[names.attn(CSA, "pattern")][..., 1:, :]
    keep = (1 - p0[..., :1]).clamp_min(1e-30)
    assert p1[..., 0].abs().max() == 0
    assert torch.allclose(p1[..., 1:], p0[..., 1:] / keep, atol=1e-6)
    phantom0, phantom1 = (c[names.attn(CSA, "phantom")][..., 1:] for c in (clean, cut))
    assert torch.allclose(phantom1, phantom0 / keep[..., 0], atol=1e-6)


def test_an_eviction_hides_token_keys_only_and_renormalises(models):
    """Eviction (keep 1, window 2) at text positions on the compressed layer: row t keeps token keys 0 and t-1, t
    (within the layer's own window) and its entries; every kept column and the phantom are the clean row over their
    sum."""
    _, m, _, _ = models
    x, T = parity.ids(), parity.T
    wanted = lambda n: names.is_attn(n, "pattern", "phantom")  # noqa: E731
    _, clean = m.run_with_cache(x, names_filter=wanted)
    edit = edits.AttentionEdit(keep=1, window=2)
    with m.hooks(fwd_hooks=[(names.attn(CSA, "v_out"), hand_over(edit))]), edits.carried(m):
        _, cut = m.run_with_cache(x, names_filter=wanted)
    i, j = torch.meshgrid(torch.arange(T), torch.arange(T), indexing="ij")
    kept = torch.cat([(j < 1) | (j > i - 2), torch.ones(T, cut[names.attn(CSA, "pattern")].shape[-1] - T)], -1).bool()
    p0, phantom0 = clean[names.attn(CSA, "pattern")], clean[names.attn(CSA, "phantom")]
    total = (p0 * kept).sum(-1) + phantom0
    assert torch.allclose(cut[names.attn(CSA, "pattern")], p0 * kept / total[..., None], atol=1e-6)
    assert torch.allclose(cut[names.attn(CSA, "phantom")], phantom0 / total, atol=1e-6)
    assert parity.max_diff(cut[names.attn(CSA, "pattern")], p0) > 1e-3


def test_an_edit_of_the_compressed_entries_equals_the_same_edit_inside_hf(models):
    """Scaling entry 1 at hook_compressed_kv moves the logits as scaling it at HF's own compressor output does."""
    ref, m, _, _ = models
    x = parity.ids()
    compressor = m.attention_module(m.decoder_layers(ref)[CSA]).compressor

    def scale_hf(_module, _inputs, out):
        entries = out[0].clone()
        entries[:, :, 1] *= 2.5
        return entries, out[1]

    def scale(e, hook):
        e = e.clone()
        e[:, 1] *= 2.5
        return e

    with torch.no_grad():
        base = ref(x).logits
        handle = compressor.register_forward_hook(scale_hf, prepend=True)
        try:
            want = ref(x).logits
        finally:
            handle.remove()
        got = m.run_with_hooks(x, fwd_hooks=[(names.attn(CSA, "compressed_kv"), scale)])
    assert parity.max_diff(want, base) > 1e-4
    assert parity.max_diff(got, want) <= 1e-5


def test_the_stream_rules_hold_in_fp64_and_the_weights_are_the_papers(models):
    _, _, _, m64 = models
    with parity.fp64_throughout():
        errors, _ = algebra.check(m64, parity.ids())  # z: v_out with the compressed entries after it
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


def test_the_heads_collapse_weights_fire_and_an_edit_of_them_reaches_the_logits(models):
    """hc_head.hook_pre (B,T,N) is the final collapse's weights: set to 1 each, the final norm reads the streams' sum,
    resid_post of the last layer, so the logits are HF's norm and LM head on that sum."""
    ref, m, _, _ = models
    x, n, last = parity.ids(), m.probe_info.extra["hc_streams"], m.probe_info.n_layers - 1
    with torch.no_grad():
        logits, cache = m.run_with_cache(x)
        pre = cache[names.hyper_head()]
        summed = m.run_with_hooks(x, fwd_hooks=[(names.hyper_head(), lambda t, hook: torch.ones_like(t))])
        by_hand = ref.lm_head(ref.model.norm(cache[names.resid(last, "post")]))
    assert pre.shape == (*x.shape, n) and bool((pre > 0).all())
    assert parity.max_diff(summed, logits) > 1e-4  # near init the weights are near one another: the norm hides most
    assert parity.max_diff(summed, by_hand) <= 1e-5


def test_parity_holds_with_the_connections_weights_far_from_their_init():
    """transformers' init leaves every mix near uniform (res ≈ 1/N), where a transposed res or a swapped pre / post
    would pass unseen: with the connections' and the head's weights drawn N(0, 1), the parity checks still hold, and
    the logit lens ends on the logits (its 'final_post' the head's collapse, not the streams' sum)."""
    from probe.checkpoints.adapters import adapt
    from probe.checkpoints.tiny import tiny_model

    ref = tiny_model("deepseek_v4")
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if "_hc." in name or "hc_head." in name:
                p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype))
    ref64 = copy.deepcopy(ref).to(torch.float64)
    models = (ref, adapt(copy.deepcopy(ref)), ref64, adapt(copy.deepcopy(ref64)))
    _, cache = models[1].run_with_cache(parity.ids())
    res = cache[names.hc(0, "mlp", "res")]
    assert (res - 1 / res.shape[-1]).abs().max() > 0.2  # far from uniform
    assert (res - res.transpose(-1, -2)).abs().max() > 0.1  # and not symmetric: a transpose would show
    parity.assert_parity(models)
    with torch.no_grad():
        logits, cache = models[1].run_with_cache(parity.ids())
        lens = cache.logit_lens()
    assert parity.max_diff(lens[-1], logits) <= 1e-5
