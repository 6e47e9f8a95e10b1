"""Pointwise attention rules (docs/definitions.md#pointwise-attention-rules): Ramapuram et al.'s sigmoid attention
and Gu et al.'s sigmoid / ELU+1 kernels with and without normalisation. The op equals the authors' own functions on
their golden outputs (tests/fixtures/sigmoid, written by make_golden.py from ml-sigmoid-attention and
model_attn_sim.py), the fused backward equals autograd through the reference and passes gradcheck, the models'
hook_pattern is the rule on their own rot_q / rot_k (hook_phantom 1 - the row sum where rows sum to at most one,
absent where they may sum past one), the hook algebra holds, a saved model under any row rule (softpick
included) reloads, and a few steps of training lower the loss; the model-level checks run on the stickbreaking
variant too (its op: test_stickbreaking.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from probe.checkpoints import algebra
from probe.hooks import names
from probe.kernels.pointwise import pointwise_attention, pointwise_of_scores
from probe.kernels.pointwise.fused import pointwise_of_scores_fused
from probe.kernels.row_rules import ROW_RULES
from probe.kernels.sink_attention.reference import attention_scores
from probe.models import create
from probe.models.model import ProbeForCausalLM
from tests.support import SMALL
from tests.support.rules import BACKENDS, gradients_by_backend

GOLDEN = load_file(str(Path(__file__).resolve().parents[1] / "fixtures" / "sigmoid" / "golden.safetensors"))
CFG = dict(SMALL, n_kv_heads=2, vocab_size=53)
IDS = torch.randint(0, 53, (2, 11), generator=torch.Generator().manual_seed(0))
APPLE_BIAS = -math.log(256)  # make_golden.py's b = -log n at n = 256
# Gu et al.'s (sim, attention_normalize) as probe's (kernel, normalise)
GU = [("sigmoid", False, "sigmoid_raw"), ("sigmoid", True, "sigmoid_norm"), ("elu1", False, "elu_raw")]
GU += [("elu1", True, "elu_norm")]
DTYPES = [(torch.float64, 1e-12, "64"), (torch.float32, 1e-5, "32")]
VARIANTS = ["sigmoid", "sigmoid-norm", "elu1", "elu1-norm", "stickbreaking"]  # stickbreaking: no RoPE


def _golden(name: str) -> torch.Tensor:
    return GOLDEN[name].transpose(1, 2)  # (B, H, T, d) -> probe's (B, T, H, d)


def test_the_rule_equals_ramapuram_et_al_sigmoid_weights_in_fp64():
    got = pointwise_of_scores(GOLDEN["scores"], "sigmoid", normalise=False, bias=APPLE_BIAS)
    assert (got - GOLDEN["apple_w64"]).abs().max().item() <= 1e-12


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype, tol, which", DTYPES)
def test_the_op_equals_ramapuram_et_al_sigmoid_attention(dtype, tol, which, backend):
    q, k, v = (GOLDEN[n].to(dtype) for n in ("q", "k", "v"))
    res = pointwise_attention(q, k, v, kernel="sigmoid", normalise=False, bias=APPLE_BIAS, backend=backend)
    assert res.out.dtype == dtype
    assert (res.out.double() - _golden("apple" + which)).abs().max().item() <= tol


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype, tol, which", DTYPES)
@pytest.mark.parametrize("kernel, normalise, theirs", GU)
def test_the_op_equals_gu_et_al_eager_attention(kernel, normalise, theirs, dtype, tol, which, backend):
    q, k, v = (GOLDEN[n].to(dtype) for n in ("q", "k", "v"))
    res = pointwise_attention(q, k, v, kernel=kernel, normalise=normalise, return_pattern=True, backend=backend)
    assert (res.out.double() - _golden(theirs + which)).abs().max().item() <= tol
    assert res.lse is None and res.lse_real is None
    if normalise:  # rows sum to S / (S + eps) < 1: the phantom is the eps's share
        assert (res.phantom + res.pattern.sum(-1) - 1).abs().max().item() <= tol
        assert bool((res.phantom >= -tol).all())
    else:
        assert res.phantom is None


@pytest.mark.parametrize("kernel, normalise, _", GU)
@pytest.mark.parametrize("bias", [0.0, APPLE_BIAS])
def test_the_fused_backward_equals_autograd_through_the_reference(kernel, normalise, _, bias):
    pairs = gradients_by_backend(pointwise_attention, kernel=kernel, normalise=normalise, bias=bias)
    for fused, reference in pairs:
        assert (fused - reference).abs().max().item() <= 1e-12


@pytest.mark.parametrize("kernel, normalise, _", GU)
def test_the_fused_rule_passes_gradcheck(kernel, normalise, _):
    g = torch.Generator().manual_seed(2)
    q, k = (torch.randn(1, 7, 2, 4, generator=g, dtype=torch.float64) * 2 for _ in range(2))
    scores = attention_scores(q, k).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda s: pointwise_of_scores_fused(s, kernel, normalise, -0.5), (scores,))


def test_a_row_that_sees_no_key_gets_zero_weights_and_hidden_keys_get_none():
    scores = torch.tensor([[[[float("-inf"), float("-inf")], [-3.0, float("-inf")], [-200.0, 50.0]]]])
    for kernel in ("sigmoid", "elu1"):
        for normalise in (False, True):
            a = pointwise_of_scores(scores, kernel, normalise)
            assert torch.equal(a, pointwise_of_scores_fused(scores, kernel, normalise))
            assert torch.isfinite(a).all() and a[0, 0, 0].sum() == 0 and a[0, 0, 1, 1] == 0
    assert pointwise_of_scores(scores, "elu1", False)[0, 0, 2, 1] == 51.0  # elu(x) + 1 = 1 + x above 0


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_model_pattern_is_the_rule_on_its_own_queries_and_keys(variant):
    model = create(variant, seed=0, **CFG).double()
    rule = ROW_RULES[variant]
    info = model.probe_info
    out, cache = model.run_with_cache(IDS)
    for l in range(CFG["n_layers"]):
        q, k = cache[names.attn(l, "rot_q")], cache[names.attn(l, "rot_k")]
        pattern = cache[names.attn(l, "pattern")]
        expected = rule.of_scores(attention_scores(q, k), bias=rule.bias(CFG["n_ctx"]))
        assert (pattern - expected).abs().max().item() <= 1e-12
        assert names.attn(l, "lse") not in cache and info.lacks(names.attn(l, "lse"))
        if rule.at_most_one:
            assert (pattern.sum(-1) + cache[names.attn(l, "phantom")] - 1).abs().max().item() <= 1e-12
        else:  # rows may sum past one: no phantom, and lacks says so in one clause
            assert names.attn(l, "phantom") not in cache and info.lacks(names.attn(l, "phantom"))
    with torch.no_grad():  # the plain forward (no hooks) gives the hooked forward's logits
        assert (model(IDS).logits - out).abs().max().item() <= 1e-12
    errors, _ = algebra.check(model, IDS)  # the scores rule is checked under the model's own rule
    assert errors["scores"] is not None and algebra.failures(errors, 1e-12) == []


def test_sigmoid_takes_b_minus_log_of_the_context_it_was_built_for():
    for n_ctx in (64, 4096):
        model = create("sigmoid", seed=0, **dict(CFG, n_ctx=n_ctx)).double()
        _, cache = model.run_with_cache(IDS)
        q, k = cache[names.attn(0, "rot_q")], cache[names.attn(0, "rot_k")]
        by_hand = torch.sigmoid(attention_scores(q, k) - math.log(n_ctx))  # hidden keys: sigmoid(-inf) = 0
        assert (cache[names.attn(0, "pattern")] - by_hand).abs().max().item() <= 1e-12


def test_an_edited_pattern_or_edited_scores_reach_the_output():
    model = create("elu1-norm", seed=0, **CFG).double()
    with torch.no_grad():
        base = model(IDS).logits
        zeroed = model.run_with_hooks(IDS, fwd_hooks=[(names.attn(0, "pattern"), lambda t, hook: t * 0)])
        shifted = model.run_with_hooks(IDS, fwd_hooks=[(names.attn(1, "attn_scores"), lambda t, hook: t - 1)])
    assert (zeroed - base).abs().max().item() > 1e-6
    assert (shifted - base).abs().max().item() > 1e-6


@pytest.mark.parametrize("rule", list(ROW_RULES))
def test_a_saved_model_under_a_row_rule_reloads_to_the_same_logits(rule, tmp_path):
    model = create("baseline", seed=2, attn_fn=rule, **CFG).eval()
    model.save_pretrained(tmp_path)
    again = ProbeForCausalLM.from_pretrained(tmp_path).eval()
    assert again.config.attn_fn == rule
    with torch.no_grad():
        assert torch.equal(model(IDS).logits, again(IDS).logits)


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_few_steps_of_training_lower_the_loss(variant):
    torch.manual_seed(0)
    model = create(variant, seed=0, **CFG).train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(12):  # one batch, again and again: the loss must fall
        logits = model(IDS).logits
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), IDS[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0] - 0.5
