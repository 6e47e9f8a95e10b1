"""Gemma 3n text under probe's hooks (probe.checkpoints.adapters.gemma3n) on a tiny random config of transformers' own
class (two AltUp streams, LAuReL, per-layer inputs; no layer sharing another's KV, which two layers cannot): parity
with HF eager, the streams' hook, and the algebra's rules, the LAuReL one broken as the modeling file computes it.
"""

from __future__ import annotations

import math

import pytest
import torch

from probe.checkpoints import algebra
from probe.hooks import names
from tests.support import parity


@pytest.fixture(scope="module")
def models():
    return parity.family_models("gemma3n_text")


def test_logits_patterns_and_a_value_edit_equal_hf_eager(models):
    parity.assert_parity(models)  # fp32 logits <= 1e-5, fp64 <= 1e-10, patterns and a hook_v edit <= 1e-5


def test_the_algebra_holds_but_for_laurels_mid_point(models):
    ref, _, _, m64 = models
    x = parity.ids()
    with parity.fp64_throughout():
        errors, _ = algebra.check(m64, x)
    assert all(errors[r] <= 1e-12 for r in algebra.RULES if r != "resid_mid"), errors
    assert errors["resid_mid"] > 1e-3  # resid_pre + attn_out misses the LAuReL branch and the 1/√2
    _, cache = m64.run_with_cache(x)
    layer = m64.decoder_layers(m64.hf_model)[0]
    pre, attn_out = cache[names.resid(0, "pre")], cache[names.sublayer_out(0, "attn")]
    with torch.no_grad():
        laurel = layer.laurel(layer.input_layernorm(pre))
    assert parity.max_diff((pre + attn_out + laurel) / math.sqrt(2), cache[names.resid(0, "mid")]) <= 1e-12


def test_the_streams_hook_is_what_the_layer_reads(models):
    ref, m, _, _ = models
    x = parity.ids()
    _, cache = m.run_with_cache(x)
    n = ref.config.altup_num_inputs
    streams = cache[names.streams(0)]
    assert streams.shape == (*x.shape, n, ref.config.hidden_size)
    with torch.no_grad():  # zeroing the inactive streams of block 1 changes the logits: the hook's edit is read
        base = m(x).logits
        cut = m.run_with_hooks(
            x, fwd_hooks=[(names.streams(1), lambda t, hook: torch.cat([t[:, :, :1], 0 * t[:, :, 1:]], 2))]
        )
    assert parity.max_diff(cut, base) > 1e-4
