"""Forgetting attention (FoX, Lin et al. 2025; docs/definitions.md#forget-gate): the per-key bias -c_j stands for the
pairwise decay Σ_{l=j+1..i} log f_l; the op with that bias equals flash-linear-attention's reference
``naive_forgetting_attn`` on its golden outputs (tests/fixtures/fox, written by make_golden.py), gradients included;
one FoX layer equals the reference on the layer's own projections; the gate's parameters take their roles and the
authors' init; grouped query heads read their KV head's gate; an edited gate reaches the output; the hook algebra
holds; settings FoX cannot take are refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from probe.checkpoints import algebra
from probe.hooks import names
from probe.hooks.attention_rules import forget_key_bias
from probe.kernels import sink_attention
from probe.models import ProbeConfig, create
from probe.models.attention import Attention
from probe.models.params import ROLES, parameter_roles
from tests.support import SMALL

GOLDEN = load_file(str(Path(__file__).resolve().parents[1] / "fixtures" / "fox" / "golden.safetensors"))
BACKENDS = ("torch", "reference")
IDS = torch.randint(0, 53, (2, 11), generator=torch.Generator().manual_seed(0))


def test_the_key_bias_is_the_pairwise_decay_up_to_a_row_constant():
    log_f = GOLDEN["g"]  # B,T,H
    bias = forget_key_bias(log_f)  # B,H,T
    B, T, H = log_f.shape
    for i in range(T):
        for j in range(i + 1):
            decay = log_f[:, j + 1 : i + 1].sum(1)  # B,H: Σ_{l=j+1..i} log f_l
            torch.testing.assert_close(bias[:, :, j] - bias[:, :, i], decay, atol=1e-12, rtol=0)
    assert forget_key_bias(log_f.float()).dtype == torch.float32  # summed in fp32 from half or fp32 gates


def _op(q, k, v, log_f, backend):
    return sink_attention(q, k, v, key_bias=forget_key_bias(log_f), backend=backend).out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype, tol, which", [(torch.float64, 1e-12, "64"), (torch.float32, 1e-5, "32")])
def test_the_op_with_the_key_bias_equals_naive_forgetting_attn(dtype, tol, which, backend):
    q, k, v, g = (GOLDEN[n].to(dtype) for n in ("q", "k", "v", "g"))
    out = _op(q, k, v, g, backend)
    assert out.dtype == dtype
    assert (out.double() - GOLDEN["out" + which]).abs().max().item() <= tol


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradients_equal_autograd_through_naive_forgetting_attn(backend):
    leaves = [GOLDEN[n].clone().requires_grad_(True) for n in ("q", "k", "v", "g")]
    out = _op(*leaves, backend)
    grads = torch.autograd.grad((out * GOLDEN["cotangent"]).sum(), leaves)
    for name, grad in zip(("dq", "dk", "dv", "dg"), grads):
        assert (grad - GOLDEN[name]).abs().max().item() <= 1e-12, name


def _golden_layer(dtype) -> Attention:
    """One FoX attention layer (no positions) holding make_golden.py's weights."""
    config = ProbeConfig(d_model=8, n_heads=2, n_layers=1, n_ctx=16, pos="none", forget_gate=True)
    attn = Attention(config, layer=0).to(dtype)
    with torch.no_grad():
        for proj, w in (("q_proj", "wq"), ("k_proj", "wk"), ("v_proj", "wv")):
            getattr(attn, proj).weight.copy_(GOLDEN[w])
        attn.forget.proj.weight.copy_(GOLDEN["wf"])
        attn.forget.bias.copy_(GOLDEN["bf"])
    return attn


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_one_fox_layer_equals_naive_forgetting_attn_on_its_projections(dtype, tol):
    attn = _golden_layer(dtype)
    seen = {}
    attn.hook_z.add_hook(lambda z, hook: seen.setdefault("z", z))
    attn.hook_forget_gate.add_hook(lambda f, hook: seen.setdefault("f", f))
    with torch.no_grad():
        attn(GOLDEN["x"].to(dtype))
    assert (seen["z"].double() - GOLDEN["block_out"]).abs().max().item() <= tol
    expected_f = torch.sigmoid(GOLDEN["x"] @ GOLDEN["wf"].T + GOLDEN["bf"])  # B,T,H
    assert seen["f"].shape == expected_f.shape and (seen["f"].double() - expected_f).abs().max().item() <= tol


def test_the_gate_takes_the_authors_init_and_its_roles():
    model = create("fox", **SMALL)
    roles = parameter_roles(model)
    for l in range(SMALL["n_layers"]):
        weight, bias = f"blocks.{l}.attn.forget.proj.weight", f"blocks.{l}.attn.forget.bias"
        assert ROLES[roles[weight]].decay and not ROLES[roles[bias]].decay  # decayed weight, undecayed bias
        assert model.get_parameter(bias).abs().max().item() == 0.0  # b_h = 0: the authors' full gate's init
        assert model.get_parameter(weight).std().item() > 0
    assert model.config.pos == "none" and all(block.attn.rotary is None for block in model.blocks)


def test_an_edited_gate_reaches_the_output():
    """f held at 1 (log f = 0) leaves plain softmax: the same model without a forget gate (paired seeds)."""
    fox = create("fox", **SMALL, vocab_size=53).double().eval()
    plain = create("baseline", pos="none", **SMALL, vocab_size=53).double().eval()
    hooks = [(names.attn(l, "forget_gate"), lambda f, hook: torch.ones_like(f)) for l in range(SMALL["n_layers"])]
    with torch.no_grad():
        held = fox.run_with_hooks(IDS, fwd_hooks=hooks)  # logits
        assert (held - plain(IDS).logits).abs().max().item() <= 1e-12
        assert (fox(IDS).logits - held).abs().max().item() > 1e-3  # the gate at work moves the output


def test_grouped_heads_read_their_kv_heads_gate():
    """GQA: the pattern is softmax(scale q_i·k_j + Σ_{l=j+1..i} log f_l) by hand, f of query head h's KV head h // G."""
    model = create("fox", **SMALL, n_kv_heads=2, vocab_size=53).double().eval()
    _, cache = model.run_with_cache(IDS)
    G, T = SMALL["n_heads"] // 2, IDS.shape[1]
    for l in range(SMALL["n_layers"]):
        q, k = cache[names.attn(l, "rot_q")], cache[names.attn(l, "rot_k")].repeat_interleave(G, 2)  # B,T,H,dh
        log_f = torch.log(cache[names.attn(l, "forget_gate")]).repeat_interleave(G, 2)  # B,T,H
        assert cache[names.attn(l, "forget_gate")].shape == (*IDS.shape, 2)
        decay = torch.zeros(IDS.shape[0], SMALL["n_heads"], T, T, dtype=torch.float64)
        for i in range(T):
            for j in range(i + 1):
                decay[:, :, i, j] = log_f[:, j + 1 : i + 1].sum(1)
        scores = torch.einsum("bihd,bjhd->bhij", q, k) * q.shape[-1] ** -0.5 + decay
        scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        assert (cache[names.attn(l, "pattern")] - scores.softmax(-1)).abs().max().item() <= 1e-12


def test_the_hook_algebra_holds_on_a_fox_model():
    model = create("fox-pro-partial", **SMALL, vocab_size=53).double().eval()
    errors, _ = algebra.check(model, IDS)  # attn_scores carry the key bias -c_j; softmax of them is the pattern
    assert errors["scores"] is not None and algebra.failures(errors, 1e-12) == []


@pytest.mark.parametrize(
    "settings, says",
    [
        (dict(attn_fn="sigmoid"), "attn_fn='softmax'"),
        (dict(abstention="sinklogit"), "choose none or sinktoken"),
    ],
)
def test_settings_fox_cannot_take_are_refused_in_one_line(settings, says):
    with pytest.raises(ValueError, match=says) as caught:
        ProbeConfig(**SMALL, forget_gate=True, **settings).validate()
    assert "\n" not in str(caught.value)
