"""Sink statistics under the row rules other than softmax (docs/definitions.md#rows-of-other-rules): the streamed row
masses are the rule applied to the scores, and on a tiny model of every rule the streamed statistics (position-0 share,
phantom share, row mass, Sink^eps, exposure, dormant heads) are the ones computed by hand from ``hook_pattern``."""

from __future__ import annotations

import pytest
import torch

from probe.analyses.capture import row_mass_hooks, rule_masses
from probe.analyses.dormant import dormant_heads
from probe.analyses.inject import exposure_stats, quiet_mask
from probe.analyses.sink_heads import sink_heads
from probe.analyses.sinks import sink_stats
from probe.hooks import names
from probe.hooks.info import ModelInfo
from probe.kernels import rule_row_masses
from probe.kernels.row_rules import ROW_RULES
from probe.models import create

RULES = tuple(ROW_RULES)  # the catalogue names its variants after the rules


def scores_by_hand(q, k, *, scale, key_bias=None, window=None, chunk=None, softcap=None):
    """(B, H, T, T) scores of q (B,T,H,dh), k (B,T,Hkv,dh), every pair at once: scale q.k, capped, + key bias, -inf
    where key j is not visible to query i (causal; within the window; within i's chunk)."""
    G = q.shape[2] // k.shape[2]
    s = scale * torch.einsum("bihd,bjhd->bhij", q, k.repeat_interleave(G, dim=2))
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if key_bias is not None:
        s = s + key_bias.repeat_interleave(G, dim=1)[:, :, None, :]
    i, j = torch.arange(q.shape[1])[:, None], torch.arange(q.shape[1])[None, :]
    seen = j <= i
    if window is not None:
        seen &= j > i - window
    if chunk is not None:
        seen &= i // chunk == j // chunk
    return s.masked_fill(~seen, float("-inf"))


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("layout", [{}, dict(window=5), dict(chunk=6), dict(softcap=2.0, key_bias=True)])
def test_rule_row_masses_are_the_rule_on_every_score(rule, layout):
    """Blocks of 4 query rows (smaller than T = 13) give each row exactly the weights of the rule on its whole row."""
    g = torch.Generator().manual_seed(0)
    B, T, H, Hkv, dh, m = 2, 13, 4, 2, 8, 3
    q, k = (torch.randn(B, T, n, dh, generator=g, dtype=torch.float64) * 2 for n in (H, Hkv))
    ind = (torch.rand(B, T, Hkv, m, generator=g) < 0.4).double()
    kb = torch.randn(B, Hkv, T, generator=g, dtype=torch.float64) if layout.get("key_bias") else None
    kw = dict(window=layout.get("window"), chunk=layout.get("chunk"), softcap=layout.get("softcap"))
    bias = ROW_RULES[rule].bias(64)
    total, mass = rule_row_masses(q, k, ind, rule=rule, bias=bias, key_bias=kb, scale=0.3, block=4, **kw)
    a = ROW_RULES[rule].of_scores(scores_by_hand(q, k, scale=0.3, key_bias=kb, **kw), bias=bias)  # (B, H, T, T)
    want = torch.einsum("bhij,bjhc->bhic", a, ind.repeat_interleave(H // Hkv, dim=2))
    torch.testing.assert_close(mass, want, atol=1e-12, rtol=0)
    torch.testing.assert_close(total, a.sum(-1), atol=1e-12, rtol=0)


def test_an_unknown_rule_is_refused_naming_the_choices():
    q = torch.zeros(1, 3, 1, 2)
    with pytest.raises(ValueError, match=r"attention rule 'softmax' has no row masses here; choose one of softpick"):
        rule_row_masses(q, q, torch.ones(1, 3, 1, 1), rule="softmax")


def hand_info(rule: str, **extra) -> ModelInfo:
    return ModelInfo("hand", "test", 1, 8, 1, 1, 2, 16, 10, attention_rule=rule, extra=extra)


@pytest.mark.parametrize("rule", RULES)
def test_a_row_that_spends_nothing_has_zero_shares(rule):
    """Query 1 scores key 0 at -200 and itself at -160: every rule's weights underflow to exactly 0 in fp32 (softpick's
    are 0 at any score <= 0). The row counts with zero shares, not NaN, and its unspent mass is 1 where rows sum to
    at most one, 0 where they may sum past one."""
    q = torch.tensor([[[[1.0, 0.0]], [[-40.0, 0.0]]]])  # (B=1, T=2, H=1, dh=2); scale 1/sqrt(2)
    k = torch.tensor([[[[5 * 2**0.5, 0.0]], [[4 * 2**0.5, 0.0]]]])
    ind = torch.tensor([1.0, 1.0])[None, :, None, None]  # every key
    total, share, unspent = rule_masses(hand_info(rule), 0, {"hook_rot_q": q, "hook_rot_k": k}, ind)
    assert float(total[0, 0, 1]) == 0.0 and float(share[0, 0, 1, 0]) == 0.0
    assert float(unspent[0, 0, 1]) == (1.0 if ROW_RULES[rule].at_most_one else 0.0)


def test_a_row_rule_beside_alibi_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"sigmoid attention rows with a phantom key, a routing gate or ALiBi"):
        row_mass_hooks(hand_info("sigmoid", alibi_slopes=[0.5]))


@pytest.fixture(scope="module", params=RULES)
def rule_model(request):
    """A tiny-tier model of the rule (2 layers) and its captured patterns on two batches of random windows."""
    model = create(request.param, tier="tiny", seed=0, n_layers=2).eval()
    toks = torch.randint(0, model.probe_info.vocab_size, (2, 2, 17), generator=torch.Generator().manual_seed(1))
    caches = [model.run_with_cache(ids)[1] for ids in toks[..., :-1]]
    return request.param, model, toks, caches


def by_hand(model, caches, layer):
    """Per row t >= 1 of every window, (B', H, T-1) each, from the captured pattern: key 0's share of the real mass,
    the row's mass, the unspent mass's share of the total (hook_phantom where it fires, else 0), key 0's share of the
    total and the total."""
    pats = torch.cat([c[names.attn(layer, "pattern")].double() for c in caches])[:, :, 1:]  # (B', H, T-1, T)
    real = pats.sum(-1)
    fires = names.attn(layer, "phantom") in caches[0]
    unspent = torch.cat([c[names.attn(layer, "phantom")].double() for c in caches])[:, :, 1:] if fires else 0 * real
    total = real + unspent

    def share(x, of):  # a row of zero mass counts with share 0
        return torch.where(of > 0, x / of.clamp_min(1e-300), 0.0)

    return pats, share(pats[..., 0], real), real, share(unspent, total), share(pats[..., 0], total), total


def test_streamed_sink_statistics_are_the_pattern_s(rule_model):
    rule, model, toks, caches = rule_model
    assert (names.attn(0, "phantom") in caches[0]) == ROW_RULES[rule].at_most_one  # the phantom fires where defined
    heads = sink_stats(model, toks)["heads"]
    eps = sink_heads(model, toks, eps=(0.05, 0.3))
    for l in range(2):
        _, pos0, real, phantom, key0, _ = by_hand(model, caches, l)
        h = heads[heads["layer"] == l]
        assert h["pos0_share"].tolist() == pytest.approx(pos0.mean((0, 2)).tolist(), abs=1e-6)
        assert h["phantom_share"].tolist() == pytest.approx(phantom.mean((0, 2)).tolist(), abs=1e-6)
        assert h["row_mass"].tolist() == pytest.approx(real.mean((0, 2)).tolist(), rel=1e-5)
        alpha = key0.mean((0, 2))  # Sink^eps's key-0 score per head
        e = eps["heads"][eps["heads"]["layer"] == l]
        assert e["key0_mass"].tolist() == pytest.approx(alpha.tolist(), abs=1e-6)
        lay = eps["layers"].query("layer == @l").set_index("epsilon")["n_sink_heads"]
        assert [lay[0.05], lay[0.3]] == [int((alpha > 0.05).sum()), int((alpha > 0.3).sum())]
    if not ROW_RULES[rule].at_most_one:  # rows spend what they like: nothing is unspent, the mass is reported
        assert (heads["phantom_share"] == 0).all() and (heads["row_mass"] > 0).all()


def test_streamed_exposure_and_dormant_heads_are_the_pattern_s(rule_model):
    rule, model, toks, caches = rule_model
    exposure = exposure_stats(model, toks, cutoffs=["q25"])["exposure_heads"]
    inputs = dormant_heads(model, toks)["inputs"]
    G = model.probe_info.kv_group
    for l in range(2):
        pats, _, _, phantom, key0, total = by_hand(model, caches, l)
        norms = torch.cat([c[names.attn(l, "v")] for c in caches]).norm(dim=-1)  # (B', T, Hkv)
        quiet = quiet_mask(norms, 0.25).permute(0, 2, 1).repeat_interleave(G, 1).double()  # (B', H, T) per key
        quiet_mass = (pats * quiet[:, :, None, :]).sum(-1)
        share = torch.where(total > 0, quiet_mass / total.clamp_min(1e-300), 0.0)  # of each row's total mass
        e = exposure[exposure["layer"] == l]
        assert e["quiet_share"].tolist() == pytest.approx(share.mean((0, 2)).tolist(), abs=1e-6)
        assert e["phantom_share"].tolist() == pytest.approx(phantom.mean((0, 2)).tolist(), abs=1e-6)
        d = inputs[inputs["layer"] == l].sort_values(["batch", "row", "head"])
        assert d["key0_mass"].tolist() == pytest.approx(key0.mean(-1).flatten().tolist(), abs=1e-6)
