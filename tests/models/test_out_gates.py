"""Qiu et al.'s G1 output gate (docs/definitions.md#output-gates): with W_g = 0 it is the baseline with every head's
output halved; the model's path (fused CPU, reference and Triton-interpreter attention) equals a plain-PyTorch
reference on outputs and gradients; edits at hook_out_gate reach the output; its shapes, parameters and capability."""

import math

import pytest
import torch

from probe.hooks import names
from probe.kernels.backend import use_backend
from probe.models import create
from probe.models.variants import added_parameters
from tests.support import SMALL

CFG = dict(SMALL, n_kv_heads=2, vocab_size=53)
FORMS = [("outgate", "elementwise"), ("outgate-head", "headwise")]
IDS = torch.randint(0, 53, (2, 11), generator=torch.Generator().manual_seed(0))


def _zero_gates(model):
    with torch.no_grad():
        for block in model.blocks:
            block.attn.out_gate.proj.weight.zero_()


@pytest.mark.parametrize("variant, form", FORMS)
def test_zero_gate_weights_are_the_baseline_with_every_head_output_halved(variant, form):
    gated, base = create(variant, seed=3, **CFG), create("baseline", seed=3, **CFG)
    _zero_gates(gated)
    with torch.no_grad():
        for block in base.blocks:
            block.attn.o_proj.weight.mul_(0.5)  # σ(0) = ½ on every head's output = ½ W_O
        torch.testing.assert_close(gated(IDS).logits, base(IDS).logits, atol=1e-5, rtol=1e-5)
        _, cache = gated.run_with_cache(IDS, names_filter=lambda n: names.is_attn(n, "out_gate"))
    gates = [cache[names.attn(l, "out_gate")] for l in range(CFG["n_layers"])]
    shape = (2, 11, CFG["n_heads"], CFG["d_model"] // CFG["n_heads"]) if form == "elementwise" else (2, 11, 4)
    assert all(g.shape == shape and g.dtype == torch.float32 and bool((g == 0.5).all()) for g in gates)


@pytest.mark.parametrize("variant, form", FORMS)
def test_the_gate_is_a_projection_of_the_normed_input_that_the_queries_read(variant, form):
    model = create(variant, seed=0, **CFG)
    info = model.probe_info
    assert info.has_out_gate and info.out_gate == form and not info.has_value_gate
    dh, H, d = CFG["d_model"] // CFG["n_heads"], CFG["n_heads"], CFG["d_model"]
    n = CFG["n_layers"] * d * H * (dh if form == "elementwise" else 1)  # W_g: d × (H·dh) or d × H per layer
    assert added_parameters(model.config) == {"gate_projection": n, "total": n}
    w = model.blocks[0].attn.out_gate.proj.weight
    assert w.std().item() == pytest.approx(1 / math.sqrt(d), rel=0.2)  # drawn like q_proj: normal, std 1/√fan-in
    assert "blocks.0.attn.out_gate.proj.weight" not in model.no_weight_decay()  # decayed, as the authors' q_proj rows
    seen = {}
    model.run_with_hooks(IDS, fwd_hooks=[(names.attn(0, "out_gate"), lambda g, hook: seen.update(g=g))])
    with torch.no_grad():
        x = model.blocks[0].ln1(model.embed(IDS))  # layer 0's normed input
        expected = torch.sigmoid(x @ w.T).view(2, 11, H, -1).squeeze(-1)
    torch.testing.assert_close(seen["g"], expected, atol=1e-6, rtol=1e-6)


def reference_attention(attn, x):
    """Plain PyTorch: causal softmax attention, Y ⊙ σ(x W_g), output projection (no probe kernel)."""
    B, T, _ = x.shape
    H, Hkv, dh = attn.n_heads, attn.n_kv, attn.d_head
    q = attn.rotary(attn.q_proj(x).view(B, T, H, dh))
    k = attn.rotary(attn.k_proj(x).view(B, T, Hkv, dh))
    v = attn.v_proj(x).view(B, T, Hkv, dh)
    k, v = (t.repeat_interleave(H // Hkv, dim=2) for t in (k, v))
    scores = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(dh)
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    y = torch.einsum("bhij,bjhd->bihd", scores.softmax(-1), v)
    g = torch.sigmoid(x @ attn.out_gate.proj.weight.T).view(B, T, H, -1)
    return attn.o_proj((y * g).reshape(B, T, H * dh))


def _check_against_reference(variant, backend):
    model = create(variant, seed=5, **CFG)
    attn = model.blocks[1].attn
    x = torch.randn(2, 13, CFG["d_model"], generator=torch.Generator().manual_seed(1), requires_grad=True)
    r = torch.randn(2, 13, CFG["d_model"], generator=torch.Generator().manual_seed(2))
    with use_backend(backend):
        out = attn(x)[0]
    (out * r).sum().backward()
    got = {n: p.grad.clone() for n, p in attn.named_parameters()} | {"x": x.grad.clone()}
    attn.zero_grad()
    x.grad = None
    ref = reference_attention(attn, x)
    (ref * r).sum().backward()
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)
    want = {n: p.grad for n, p in attn.named_parameters()} | {"x": x.grad}
    assert set(got) == set(want) and "out_gate.proj.weight" in got
    for n in want:
        torch.testing.assert_close(got[n], want[n], atol=5e-5, rtol=1e-3, msg=n)


@pytest.mark.parametrize("backend", ["torch", "reference"])
@pytest.mark.parametrize("variant", ["outgate", "outgate-head"])
def test_the_model_path_equals_a_plain_pytorch_reference_in_outputs_and_gradients(variant, backend):
    _check_against_reference(variant, backend)


@pytest.mark.parametrize("variant", ["outgate", "outgate-head"])
def test_the_triton_interpreter_path_equals_the_plain_pytorch_reference(variant):
    pytest.importorskip("triton")
    from probe.kernels.sink_attention import triton as sink_triton

    if not torch.cuda.is_available() and type(sink_triton._fwd_kernel).__name__ != "InterpretedFunction":
        pytest.skip("triton imported before TRITON_INTERPRET=1 (see tests/conftest.py)")
    _check_against_reference(variant, "triton")


@pytest.mark.parametrize("variant", ["outgate", "outgate-head"])
def test_edits_at_hook_out_gate_reach_the_output(variant):
    gated, base = create(variant, seed=7, **CFG), create("baseline", seed=7, **CFG)
    with torch.no_grad():
        opened = gated.run_with_hooks(IDS, fwd_hooks=[(lambda n: names.is_attn(n, "out_gate"), _const(1.0))])
        torch.testing.assert_close(opened, base(IDS).logits, atol=1e-5, rtol=1e-5)  # g = 1: no gate at all
        z = {}
        closed = gated.run_with_hooks(
            IDS,
            fwd_hooks=[
                (names.attn(1, "out_gate"), _const(0.0)),
                (names.attn(1, "z"), lambda t, hook: z.update(z=t)),
            ],
        )
        assert bool((z["z"] == 0).all())  # a closed gate: the layer's attention writes nothing
        for block in gated.blocks[1:]:
            block.attn.o_proj.weight.zero_()
        torch.testing.assert_close(closed, gated(IDS).logits, atol=1e-5, rtol=1e-5)


def _const(value):
    return lambda g, hook: torch.full_like(g, value)


def test_an_unknown_output_gate_names_the_choices():
    from probe.models.config import ProbeConfig

    with pytest.raises(ValueError, match="out_gate='perhead' is not valid; choose one of none, elementwise, headwise"):
        ProbeConfig(out_gate="perhead")


def test_a_saved_gated_model_reloads_with_its_gate(tmp_path):
    from transformers import AutoModelForCausalLM

    model = create("outgate-head", seed=2, **CFG)
    model.save_pretrained(tmp_path)
    back = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert back.probe_info.out_gate == "headwise"
    with torch.no_grad():
        torch.testing.assert_close(back(IDS).logits, model.eval()(IDS).logits)
