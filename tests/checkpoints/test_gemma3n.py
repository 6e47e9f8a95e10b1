"""Gemma 3n text under probe's hooks (probe.checkpoints.adapters.gemma3n) on a tiny random config of transformers' own
class (two AltUp streams, LAuReL, per-layer inputs; no layer sharing another's KV, which two layers cannot): parity
with HF eager, the algebra's rules with the LAuReL branch and the AltUp streams, and the stream, coefficient and
branch hooks on a folder saved and loaded as a user's is.
"""

from __future__ import annotations

import math

import pytest
import torch

import probe
from probe.checkpoints import algebra
from probe.checkpoints.tiny import tiny_model
from probe.hooks import names
from tests.support import parity


@pytest.fixture(scope="module")
def models():
    return parity.family_models("gemma3n_text")


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """(probe.load of a saved tiny gemma3n_text folder in fp64, its HF model, ids, the logits and cache of one
    forward)."""
    folder = tmp_path_factory.mktemp("gemma3n_text")
    tiny_model("gemma3n_text").save_pretrained(folder)
    model = probe.load(str(folder), dtype=torch.float64)
    x = parity.ids()
    with torch.no_grad():
        logits, cache = model.run_with_cache(x)
    return model, model.hf_model, x, logits, cache


def _edited(model, x, edits: list, kept: list | None):
    """(logits, cache of the ``kept`` names, None: all) of one forward with the ``edits`` (name, hook) in place."""
    with torch.no_grad(), model.hooks(fwd_hooks=edits):
        return model.run_with_cache(x, names_filter=kept)


def test_logits_patterns_and_a_value_edit_equal_hf_eager(models):
    parity.assert_parity(models)  # fp32 logits <= 1e-5, fp64 <= 1e-10, patterns and a hook_v edit <= 1e-5


def test_every_rule_of_the_algebra_holds(models):
    _, m, _, m64 = models
    x = parity.ids()
    with parity.fp64_throughout():
        errors, skipped = algebra.check(m64, x)
    assert algebra.failures(errors, 1e-12) == [] and all(errors[r] is not None for r in algebra.RULES), skipped
    errors, _ = algebra.check(m, x)  # fp32: float error only
    assert algebra.failures(errors, 1e-5) == [], errors


def test_each_new_hook_fires_with_its_shape(loaded):
    model, hf, x, _, cache = loaded
    config = hf.config
    B, T, n, d, p = *x.shape, config.altup_num_inputs, config.hidden_size, config.hidden_size_per_layer_input
    for l in range(config.num_hidden_layers):
        for point in names.STREAM_POINTS[::2]:  # the block's input and what it hands on
            assert cache[names.streams(l, point)].shape == (B, T, n, d)
        assert cache[names.altup(l, "predict")].shape == (B, T, n, n)
        assert cache[names.altup(l, "correct")].shape == (B, T, n)
        assert cache[names.branch_out(l, "laurel")].shape == (B, T, d)
        assert cache[names.branch_out(l, "per_layer")].shape == (B, T, d)
        assert cache[names.per_layer_input(l)].shape == (B, T, p)


def test_laurel_out_is_the_branch_by_hand_and_completes_resid_mid(loaded):
    """laurel_out = x + norm(R·L·x) with x = ln1(resid_pre), from the branch's own weights; √2·resid_mid = resid_pre +
    attn_out + laurel_out."""
    model, hf, _, _, cache = loaded
    for l, layer in enumerate(model.decoder_layers(hf)):
        pre, attn_out, mid = (
            cache[n] for n in (names.resid(l, "pre"), names.sublayer_out(l, "attn"), names.resid(l, "mid"))
        )
        laurel = cache[names.branch_out(l, "laurel")]
        branch = layer.laurel
        with torch.no_grad():
            x = layer.input_layernorm(pre)
            by_hand = x + branch.post_laurel_norm(x @ branch.linear_left.weight.T @ branch.linear_right.weight.T)
        assert parity.max_diff(laurel, by_hand) <= 1e-12
        total = pre + attn_out + laurel
        assert parity.max_diff(math.sqrt(2) * mid, total) <= 1e-12 * float(total.abs().max())
        assert parity.max_diff(pre + attn_out, math.sqrt(2) * mid) > 1e-3  # the branch matters


def test_adding_zero_to_laurel_changes_nothing_and_ablating_it_moves_resid_mid_by_its_share(loaded):
    model, _, x, logits, cache = loaded
    site, mid = names.branch_out(0, "laurel"), names.resid(0, "mid")
    same, kept = _edited(model, x, [(site, lambda t, hook: t + 0)], [mid])
    cut, ablated = _edited(model, x, [(site, lambda t, hook: torch.zeros_like(t))], [mid])
    base = cache[mid]
    assert torch.equal(kept[mid], base) and torch.equal(same, logits)
    assert parity.max_diff(cut, logits) > 1e-4  # the ablation reaches the logits
    laurel = cache[site]
    assert parity.max_diff(base - ablated[mid], laurel / math.sqrt(2)) <= 1e-12 * float(laurel.abs().max())


def test_the_per_layer_input_is_what_the_model_hands_the_layer_and_gates_its_write(loaded):
    model, hf, x, _, cache = loaded
    text = hf.model
    with torch.no_grad():
        given = text.project_per_layer_inputs(text.embed_tokens(x), text.get_per_layer_inputs(x))  # B,T,L,p
        for l in range(hf.config.num_hidden_layers):
            assert parity.max_diff(cache[names.per_layer_input(l)], given[:, :, l]) <= 1e-12
    zero = [(names.per_layer_input(0), lambda t, hook: torch.zeros_like(t))]
    _, gated = _edited(model, x, zero, [names.branch_out(0, "per_layer")])
    assert cache[names.branch_out(0, "per_layer")].abs().max() > 1e-3
    assert torch.equal(
        gated[names.branch_out(0, "per_layer")], torch.zeros_like(cache[names.branch_out(0, "per_layer")])
    )


def test_altups_coefficient_edits_are_read(loaded):
    """Zero prediction and correction coefficients: the active prediction is the active stream itself, and stream 0
    (which the per-layer branch does not write) leaves the block as it came."""
    model, hf, x, _, _ = loaded
    active = hf.config.altup_active_idx
    zero = [(names.altup(0, p), lambda t, hook: torch.zeros_like(t)) for p in names.ALTUP_POINTS]
    kept = [names.streams(0), names.streams(0, "post"), names.resid(0, "pre")]
    _, cache = _edited(model, x, zero, kept)
    streams, handed_on = cache[names.streams(0)], cache[names.streams(0, "post")]
    assert torch.equal(cache[names.resid(0, "pre")], streams[:, :, active])
    assert torch.equal(handed_on[:, :, 0], streams[:, :, 0])


def test_the_altup_rules_catch_a_missing_term(loaded):
    """The checker's Gemma 3n rules fail where a term is left out: the LAuReL write (resid_mid) or the per-layer write
    (the corrected streams, resid_post)."""
    model, _, _, _, cache = loaded
    for point, rule in (("laurel", "resid_mid"), ("per_layer", "resid_post")):
        cut = dict(cache)
        cut[names.branch_out(0, point)] = torch.zeros_like(cache[names.branch_out(0, point)])
        errors: dict = {}
        algebra._residual(cut, model.probe_info, errors, {})
        assert errors[rule] > 1e-3, (point, errors)


def test_an_edited_resid_pre_is_the_prediction_the_correction_starts_from(loaded):
    """resid_pre + 1 in block 0: it no longer is the prediction from hook_streams (resid_mid's AltUp rule), but the
    corrected streams start from it (resid_post's rules hold)."""
    model, _, x, _, _ = loaded
    _, cache = _edited(model, x, [(names.resid(0, "pre"), lambda t, hook: t + 1)], None)
    errors: dict = {}
    algebra._residual(dict(cache), model.probe_info, errors, {})
    assert errors["resid_mid"] > 0.5 and errors["resid_post"] <= 1e-12, errors
