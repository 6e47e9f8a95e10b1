"""Gemma 3n text under probe's hooks (probe.checkpoints.adapters.gemma3n) on a tiny random config of transformers' own
class (two AltUp streams, LAuReL, per-layer inputs; no layer sharing another's KV, which two layers cannot): parity
with HF eager, the streams' hook, and the algebra's rules, the LAuReL one broken as the modeling file computes it.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from probe.checkpoints import algebra
from probe.checkpoints.adapters import adapt
from probe.checkpoints.tiny import tiny_model
from probe.hooks import names
from tests.support import parity


@pytest.fixture(scope="module")
def models():
    ref = tiny_model("gemma3n_text")
    ref64 = copy.deepcopy(ref).to(torch.float64)
    return ref, adapt(copy.deepcopy(ref)), ref64, adapt(copy.deepcopy(ref64))


def test_logits_and_patterns_equal_hf_eager(models):
    ref, m, ref64, m64 = models
    x = parity.ids()
    fp32, cache = parity._logits(ref, m, x, "fp32")  # raises past 1e-5 (fast and every-hook paths)
    fp64, _ = parity._logits(ref64, m64, x, "fp64")  # past 1e-10
    assert fp32["logits_fp32"] <= parity.TOL["fp32"] and fp64["logits_fp64"] <= parity.TOL["fp64"]
    parity._every_hook_fires(m, cache)
    assert parity._pattern_vs_output_attentions(ref, m, x, cache)["pattern_vs_output_attentions"] <= 1e-5
    assert parity._value_edit(ref, m, x)["value_edit"] <= 1e-5


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
