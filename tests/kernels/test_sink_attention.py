"""sink_attention (probe/kernels/sink_attention/): the fp32 reference against explicit fp64 softmaxes, then every other
backend against the reference on outputs and every gradient: sdpa (the fused torch path) on CPU, triton on CUDA or
under the Triton interpreter (tests/kernels/interpreter.py); each row's real-key lse (``return_lse``) on every path.
Interpreter grids are tiny; larger ones are marked slow (-m slow); bf16 and large shapes need a GPU."""

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from probe.kernels import sink_attention
from probe.kernels.sink_attention import edits
from probe.kernels.sink_attention.dispatch import real_lse as fallback_real_lse
from probe.kernels.sink_attention.reference import attention_probs, real_lse_blocked, visible_mask
from probe.models import ProbeConfig
from tests.kernels.interpreter import CUDA, DEV, FRESH_PROCESS, TRITON, case, rerun_in_fresh_process
from tests.kernels.naive import SINKS, inputs, naive_attention, rand_qkv, real_lse
from tests.support.gates import TRANSFORMS, gated


@pytest.mark.skipif(not FRESH_PROCESS, reason="the Triton cases run in this process")
def test_triton_in_fresh_process(request):
    rerun_in_fresh_process(request, __file__)


# ---------------------------------------------------------------- value gates (what the op is given)


def test_value_gate_formulas():
    v = torch.randn(2, 5, 3, 8)
    tau, w, b = torch.rand(3), torch.randn(3, 8), torch.randn(3)
    out, _, g = gated("none", v)
    assert out is v and g is None
    out, _, g = gated("silu", v)
    torch.testing.assert_close(out, v * torch.sigmoid(v))
    torch.testing.assert_close(g, torch.sigmoid(v))
    out, _, g = gated("tanh", v)
    torch.testing.assert_close(out, v * torch.tanh(v))
    torch.testing.assert_close(g, torch.tanh(v))
    norm_g = torch.sigmoid(8.0 * (v.norm(dim=-1) / math.sqrt(8) - tau))  # (B, T, Hkv)
    out, _, g = gated("norm", v, tau=tau)
    torch.testing.assert_close(g, norm_g)
    torch.testing.assert_close(out, norm_g[..., None] * v)
    out, _, g = gated("norm", v, tau=tau, beta=2.0)
    torch.testing.assert_close(g, torch.sigmoid(2.0 * (v.norm(dim=-1) / math.sqrt(8) - tau)))
    proj_g = torch.sigmoid(torch.einsum("bthd,hd->bth", v, w) + b)
    out, _, g = gated("proj", v, w=w, b=b)
    torch.testing.assert_close(g, proj_g)
    torch.testing.assert_close(out, proj_g[..., None] * v)
    out, bias, g = gated("routing-norm", v, tau=tau)
    assert out is v and g.shape == (2, 5, 3)
    torch.testing.assert_close(g, norm_g)
    torch.testing.assert_close(bias, F.logsigmoid(8.0 * (v.norm(dim=-1) / math.sqrt(8) - tau)).transpose(1, 2))


def test_value_gate_dtype_and_errors():
    v = torch.randn(1, 3, 2, 4).bfloat16()
    out, _, g = gated("norm", v, tau=torch.zeros(2))
    assert out.dtype == torch.bfloat16 and g.dtype == torch.float32
    with pytest.raises(ValueError, match="none.*norm.*routing-norm.*silu"):
        ProbeConfig(value_gate="swish")
    model = ProbeConfig(n_layers=1, d_model=8, n_heads=2, d_mlp=8, vocab_size=11, value_gate="norm")
    from probe.models import ProbeForCausalLM

    state = {n: t for n, t in ProbeForCausalLM(model).state_dict().items() if not n.endswith("gate.tau")}
    with pytest.raises(RuntimeError, match="tau"):  # a norm gate has its threshold τ
        ProbeForCausalLM(model).load_state_dict(state)


# ---------------------------------------------------------------- the reference against explicit softmaxes


@pytest.mark.parametrize("sink_value", SINKS)
@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("transform", ["none", "proj", "routing-norm"])
def test_reference_matches_naive(sink_value, window, transform):
    q, k, v = rand_qkv()
    sink = None if sink_value is None else torch.tensor([sink_value, 0.5, -1.0, sink_value])
    key_bias = torch.randn(2, 2, 6)
    tau, w, b = torch.rand(2), torch.randn(2, 6), torch.randn(2)
    v_in, bias, gate = gated(transform, v, key_bias, tau=tau, w=w, b=b)
    res = sink_attention(q, k, v_in, sink=sink, key_bias=bias, window=window, return_pattern=True, backend="reference")
    log_gate = torch.log(gate) if transform == "routing-norm" else None
    out, pattern, phantom = naive_attention(q, k, v_in, sink=sink, key_bias=key_bias, window=window, log_gate=log_gate)
    torch.testing.assert_close(res.out.double(), out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(res.pattern.double(), pattern, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(res.phantom.double(), phantom, atol=1e-6, rtol=1e-5)
    assert res.lse.shape == (2, 4, 6) and res.lse.dtype == torch.float32
    torch.testing.assert_close(res.pattern.sum(-1) + res.phantom, torch.ones(2, 4, 6))  # pattern + phantom = 1


def test_sink_minus_inf_is_plain_softmax_attention():
    q, k, v = rand_qkv(dv=8)
    plain = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True
    ).transpose(1, 2)
    for backend in ("reference", "sdpa"):
        for sink in (None, torch.full((4,), float("-inf"))):
            torch.testing.assert_close(sink_attention(q, k, v, sink=sink, backend=backend).out, plain)


def test_zero_sink_is_off_by_one():
    q, k, v = rand_qkv(B=1, H=2, Hkv=2)
    res = sink_attention(q, k, v, sink=torch.zeros(2), return_pattern=True, backend="reference")
    s = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(8)
    s = s.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf"))
    e = torch.exp(s)
    torch.testing.assert_close(res.pattern, e / (1 + e.sum(-1, keepdim=True)))  # softmax with an extra 0 logit


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
def test_extreme_sinks_stay_finite(backend):
    q, k, v = (x.requires_grad_() for x in rand_qkv())
    sink = torch.tensor([100.0, -100.0, 100.0, -100.0], requires_grad=True)
    out = sink_attention(q, k, v, sink=sink, backend=backend).out
    out.square().sum().backward()
    for t in (out, q.grad, k.grad, v.grad, sink.grad):
        assert torch.isfinite(t).all()
    assert out[:, :, 0].abs().max() < 1e-30 and out[:, :, 1].abs().min() > 0  # +100 absorbs the row


def test_window_and_scale():
    q, k, v = rand_qkv(B=1, T=5, H=2, Hkv=1)
    res = sink_attention(q, k, v, window=1, scale=0.3, return_pattern=True, backend="reference")
    torch.testing.assert_close(res.pattern, torch.eye(5).expand(1, 2, 5, 5))  # window 1: only the diagonal
    torch.testing.assert_close(res.out, v.expand(1, 5, 2, 6))


def test_a_mask_replaces_the_causal_rule_and_fewer_queries_are_the_last_ones():
    q, k, v = rand_qkv(T=7)
    sink, key_bias = torch.tensor([0.3, -1.0, 2.0, 0.0]), torch.randn(2, 2, 7)
    kw = dict(sink=sink, key_bias=key_bias, return_pattern=True, backend="reference")
    full = sink_attention(q, k, v, window=3, **kw)
    i, j = torch.arange(7)[:, None], torch.arange(7)[None]
    additive = torch.zeros(7, 7).masked_fill(~((j <= i) & (j > i - 3)), float("-inf"))[None, None]
    masked = sink_attention(q, k, v, mask=additive, **kw)
    for a, b in zip(masked, full):
        torch.testing.assert_close(a, b)
    last = sink_attention(q[:, 4:], k, v, window=3, **kw)  # a cache: 3 new queries over 7 keys
    torch.testing.assert_close(last.out, full.out[:, 4:])
    torch.testing.assert_close(last.pattern, full.pattern[:, :, 4:])
    torch.testing.assert_close(last.phantom, full.phantom[:, :, 4:])


# ---------------------------------------------------------------- dispatch


def test_dispatch_picks_reference_only_for_patterns():
    q, k, v = rand_qkv()
    for backend in ("auto", "torch"):
        with_pattern = sink_attention(q, k, v, return_pattern=True, backend=backend)
        assert with_pattern.pattern is not None and with_pattern.phantom is not None
        fast = sink_attention(q, k, v, backend=backend)
        assert fast.pattern is None and fast.phantom is None
        torch.testing.assert_close(fast.out, with_pattern.out)


def test_backend_and_shape_errors():
    q, k, v = rand_qkv()
    with pytest.raises(ValueError, match="auto.*torch.*reference.*sdpa.*triton"):
        sink_attention(q, k, v, backend="flash")
    with pytest.raises(ValueError, match="pattern"):
        sink_attention(q, k, v, return_pattern=True, backend="sdpa")
    with pytest.raises(ValueError, match="multiple"):
        sink_attention(q[:, :, :3], k, v)
    with pytest.raises(ValueError, match="sink"):
        sink_attention(q, k, v, sink=torch.zeros(2))


# ---------------------------------------------------------------- every backend against the reference


def attend(x, backend, transform="none", **kw):
    """The op on the values and key bias that the value gate ``transform`` (x's tau, w, b) gives."""
    v, key_bias, _ = gated(transform, x["v"], x.get("key_bias"), tau=x["tau"], w=x["w"], b=x["b"])
    return sink_attention(x["q"], x["k"], v, sink=x.get("sink"), key_bias=key_bias, backend=backend, **kw)


def compare_with_reference(x, backend, *, out_tol=(2e-5, 1e-4), grad_tol=(2e-5, 1e-4), transform="none", **kw):
    """``backend`` against the reference: the output, the lse where the backend gives one (the Triton kernel's is
    differentiable, so it joins the loss), and the gradient of every leaf of ``x`` (a -inf sink gets none)."""
    ref = attend(x, "reference", transform=transform, **kw)
    got = attend(x, backend, transform=transform, **kw)
    torch.testing.assert_close(got.out, ref.out, atol=out_tol[0], rtol=out_tol[1])
    g = torch.Generator().manual_seed(1)
    cot_out = torch.randn(ref.out.shape, generator=g).to(DEV)
    loss_ref, loss_got = (ref.out * cot_out).sum(), (got.out * cot_out).sum()
    if got.lse is not None:
        torch.testing.assert_close(got.lse, ref.lse, atol=out_tol[0], rtol=out_tol[1])
        cot_lse = torch.randn(ref.lse.shape, generator=g).to(DEV)
        loss_ref, loss_got = loss_ref + (ref.lse * cot_lse).sum(), loss_got + (got.lse * cot_lse).sum()
    names = list(x)
    g_ref = torch.autograd.grad(loss_ref, [x[n] for n in names], allow_unused=True, retain_graph=True)
    g_got = torch.autograd.grad(loss_got, [x[n] for n in names], allow_unused=True)  # the gates' graph is shared
    for name, a, b in zip(names, g_got, g_ref):
        if b is None:
            assert a is None or not a.any(), name
        else:
            torch.testing.assert_close(
                a, b, atol=grad_tol[0], rtol=grad_tol[1], msg=lambda m, name=name: f"d{name}: {m}"
            )
    if x.get("sink") is not None and bool(torch.isneginf(x["sink"][0])):
        assert not g_ref[names.index("sink")][0] and not g_got[names.index("sink")][0]  # no gradient at -inf


SDPA = dict(out_tol=(2e-6, 1e-5), grad_tol=(2e-5, 1e-4))  # the fused torch path is fp32 throughout
SDPA_GRID = list(itertools.product(TRANSFORMS, SINKS, [None, 3], [(4, 2), (2, 2)], [False, True]))


@pytest.mark.parametrize("transform,sink_value,window,heads,key_bias", SDPA_GRID)
def test_sdpa_matches_reference(transform, sink_value, window, heads, key_bias):
    x = inputs(H=heads[0], Hkv=heads[1], sink_value=sink_value, key_bias=key_bias)
    compare_with_reference(x, "sdpa", transform=transform, window=window, **SDPA)


# (B, T, H, Hkv, dh, dv): T spans several 16-blocks and ends mid-block; GQA groups 1, 2, 3; dv != dh
TRITON_SHAPES = [(1, 19, 2, 2, 8, 8), (2, 24, 4, 2, 16, 8), (1, 35, 3, 1, 8, 16)]


@pytest.mark.parametrize("backend", [TRITON])
@pytest.mark.parametrize("shape,sink_value,window", list(itertools.product(TRITON_SHAPES, SINKS, [None, 5])))
def test_triton_matches_reference(backend, shape, sink_value, window):
    compare_with_reference(inputs(*shape, sink_value=sink_value, key_bias=True), backend, window=window)


@pytest.mark.parametrize("backend", [TRITON])
@pytest.mark.parametrize("transform,key_bias", list(itertools.product(TRANSFORMS, [False, True])))
def test_triton_matches_reference_on_every_value_gate(backend, transform, key_bias):
    x = inputs(1, 21, 4, 2, 8, 8, sink_value=0.5, key_bias=key_bias)
    compare_with_reference(x, backend, transform=transform, window=9, scale=0.4)


@pytest.mark.slow
@pytest.mark.parametrize("backend", [TRITON])
@pytest.mark.parametrize(
    "shape,sink_value,window,transform",
    list(itertools.product([(2, 70, 8, 2, 32, 32), (1, 100, 4, 4, 64, 48)], SINKS, [None, 1, 33], ["none", "proj"])),
)
def test_triton_matches_reference_slow_grid(backend, shape, sink_value, window, transform):
    x = inputs(*shape, sink_value=sink_value, key_bias=True)
    compare_with_reference(x, backend, window=window, transform=transform)


# kept first keys: none, inside the first key block, spanning a Triton block boundary (16), past the window's first
KEPT = [case("sdpa", (2, 11, 4, 2, 8, 6), *c) for c in [(None, 0, 2), (None, 1, 2), (0.0, 2, 3), (-100.0, 4, 1)]]
KEPT += [case("triton", shape, *c, 3) for shape in TRITON_SHAPES for c in [(None, 1), (0.5, 0), (0.5, 4), (None, 18)]]


@pytest.mark.parametrize("backend,shape,sink_value,keep,window", KEPT)
def test_kept_first_keys_match_reference(backend, shape, sink_value, keep, window):
    """The kept-first-keys rule (StreamingLLM eviction): on sdpa in its explicit mask, on Triton in the forward and
    both backward kernels."""
    tol = SDPA if backend == "sdpa" else {}
    compare_with_reference(
        inputs(*shape, sink_value=sink_value, key_bias=True), backend, window=window, keep=keep, **tol
    )


@pytest.mark.parametrize("sink_value", [None, 0.0, 100.0])
@pytest.mark.parametrize("queries", [7, 3])  # all, or the last 3 over 7 keys (a cache)
def test_sdpa_with_a_callers_mask_matches_reference(sink_value, queries):
    """HF's additive masks (causal, a window, left padding as the finite minimum) and caches: values and gradients;
    Triton takes neither."""
    x = inputs(sink_value=sink_value, key_bias=True)
    i, j = torch.arange(7)[:, None], torch.arange(7)[None]
    allowed = ((j <= i) & (i - j < 5))[None, None].repeat(2, 1, 1, 1)
    allowed[1, :, :, :2] = False  # sequence 1 is left-padded by two
    allowed[1, :, :2, 0] = True  # its padded rows stay non-empty
    mask = torch.zeros(2, 1, 7, 7).masked_fill(~allowed, torch.finfo(torch.float32).min)[:, :, 7 - queries :]
    q = x["q"][:, 7 - queries :]
    kw = dict(sink=x.get("sink"), key_bias=x["key_bias"], mask=mask)
    ref = sink_attention(q, x["k"], x["v"], backend="reference", **kw)
    fast = sink_attention(q, x["k"], x["v"], backend="sdpa", **kw)
    torch.testing.assert_close(fast.out, ref.out, atol=2e-6, rtol=1e-5)
    cot = torch.randn_like(ref.out)
    grads_of = (torch.autograd.grad(r.out, list(x.values()), cot, allow_unused=True) for r in (fast, ref))
    for name, a, b in zip(x, *grads_of):
        if b is None:
            assert a is None or not a.any(), name
        else:
            torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4, msg=lambda m, name=name: f"d{name}: {m}")
    with pytest.raises(ValueError, match="triton"):
        sink_attention(q, x["k"], x["v"], backend="triton", **kw)


@pytest.mark.parametrize("key_bias", [True, False])  # extra coordinates / the flash kernel's rows rescaled
def test_sdpa_lse_only_without_autograd(key_bias):
    x = inputs(sink_value=0.0, key_bias=key_bias)
    ref = attend(x, "reference", transform="norm")
    assert attend(x, "sdpa", transform="norm").lse is None  # the fused kernel's lse has no gradient
    with torch.no_grad():
        lse = attend(x, "sdpa", transform="norm").lse
    torch.testing.assert_close(lse, ref.lse)


def test_sdpa_causal_sink_path_copies_nothing(monkeypatch):
    """A causal sink with no key bias runs the flash kernel on q, k, v as they are: no phantom row or coordinate."""
    x = inputs(dh=8, dv=8, sink_value=1.0)
    ref = attend(x, "reference")

    def no_cat(*a, **k):
        raise AssertionError("torch.cat called: the phantom was folded in as a copy")

    monkeypatch.setattr(torch, "cat", no_cat)
    fast = attend(x, "sdpa")
    monkeypatch.undo()
    torch.testing.assert_close(fast.out, ref.out, atol=2e-6, rtol=1e-5)


def test_sdpa_scale_and_wide_values():
    x = inputs(dh=8, dv=20, sink_value=1.0)
    ref = attend(x, "reference", scale=0.7, window=4)
    torch.testing.assert_close(attend(x, "sdpa", scale=0.7, window=4).out, ref.out, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("key_bias", [True, False])
def test_sdpa_bf16_close_to_fp32_reference(key_bias):
    x = inputs(sink_value=0.5, key_bias=key_bias)
    ref = attend(x, "reference", transform="silu")
    v, key_bias, _ = gated("silu", x["v"].bfloat16(), x.get("key_bias"))
    low = sink_attention(x["q"].bfloat16(), x["k"].bfloat16(), v, sink=x["sink"], key_bias=key_bias, backend="sdpa")
    assert low.out.dtype == torch.bfloat16
    torch.testing.assert_close(low.out.float(), ref.out, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_sdpa_half_carries_a_large_key_bias(dtype):
    """FoX's key bias -Σ_{l<=j} log f_l grows with j (here to ~180): in bf16 / fp16 the fused path splits it into parts
    exact in the dtype, so output and gradients stay as close to fp64 on the same rounded inputs as bf16 outputs
    allow (one coordinate in bf16 would round the bias by ~0.4 and move whole rows)."""
    from probe.kernels.sink_attention.sdpa import bias_coordinates

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 256, 2, 16, generator=g).to(dtype) for _ in range(3))
    bias = -F.logsigmoid(torch.randn(1, 2, 256, generator=g)).cumsum(-1)  # (B, Hkv, T): -c_j, up to ~180
    scale = 16**-0.5
    unit, parts = bias_coordinates(bias, scale, dtype)
    assert all(torch.equal(p, p.to(dtype).float()) for p in parts)  # each part exact in the dtype
    assert (scale * unit * sum(parts) - bias).abs().max().item() <= 1e-6 * bias.abs().max().item()
    wide = [t.double().requires_grad_() for t in (q, k, v, bias)]
    low = [t.detach().requires_grad_() for t in (q, k, v, bias)]
    ref = sink_attention(*wide[:3], key_bias=wide[3], backend="reference").out
    out = sink_attention(*low[:3], key_bias=low[3], backend="sdpa").out
    assert (out.double() - ref).abs().max().item() <= 2e-2
    cot = torch.randn(ref.shape, generator=g, dtype=torch.float64)
    d_ref = torch.autograd.grad(ref, wide[3], cot)[0]
    d_low = torch.autograd.grad(out, low[3], cot.to(dtype))[0]
    assert (d_low.double() - d_ref).abs().max().item() <= 3e-2 * d_ref.abs().max().item()


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("sink_value,window", [(None, None), (0.0, None), (3.0, 128), (float("-inf"), None)])
def test_triton_bf16_large(sink_value, window):
    x = inputs(2, 1024, 8, 2, 64, 64, sink_value=sink_value, key_bias=True)
    args = {n: x[n] for n in ("sink", "key_bias") if n in x}
    low = {n: x[n].detach().bfloat16().requires_grad_() for n in ("q", "k", "v")}
    ref = sink_attention(x["q"], x["k"], x["v"], window=window, backend="reference", **args)
    tri = sink_attention(low["q"], low["k"], low["v"], window=window, backend="triton", **args)
    torch.testing.assert_close(tri.out.float(), ref.out, atol=2e-2, rtol=2e-2)
    cot = torch.randn_like(ref.out)
    g_ref = torch.autograd.grad(ref.out, [x["q"], x["k"], x["v"]], cot)
    g_tri = torch.autograd.grad(tri.out, [low["q"], low["k"], low["v"]], cot.bfloat16())
    for a, b in zip(g_tri, g_ref):
        assert (a.float() - b).norm() / b.norm() < 2e-2


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_triton_fp32_large():
    x = inputs(1, 700, 4, 2, 64, 64, sink_value=0.5, key_bias=True)
    compare_with_reference(x, "triton", window=300, out_tol=(1e-4, 1e-3), grad_tol=(1e-4, 1e-3))


# ---------------------------------------------------------------- the real keys' lse (return_lse, hook_lse)

LSE_B, LSE_T, LSE_H, LSE_HKV, LSE_DH = 2, 37, 4, 2, 8
LSE_CASES = [dict(), dict(window=5), dict(key_bias=True), dict(key_bias=True, window=5)]


def lse_inputs(seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(LSE_B, LSE_T, h, LSE_DH, generator=g, dtype=dtype) for h in (LSE_H, LSE_HKV, LSE_HKV))
    sink = 3 * torch.randn(LSE_H, generator=g, dtype=dtype)
    return q, k, v, sink, torch.randn(LSE_B, LSE_HKV, LSE_T, generator=g, dtype=dtype)


@pytest.mark.parametrize("backend", ["sdpa", "reference", "auto"])
@pytest.mark.parametrize("with_sink", [False, True])
@pytest.mark.parametrize("case_", range(len(LSE_CASES)))
def test_lse_real_is_the_real_keys_lse_on_every_path(backend, with_sink, case_):
    q, k, v, sink, bias = lse_inputs(case_)
    kw = dict(LSE_CASES[case_])
    if kw.pop("key_bias", False):
        kw["key_bias"] = bias
    res = sink_attention(q, k, v, sink=sink if with_sink else None, return_lse=True, backend=backend, **kw)
    torch.testing.assert_close(res.lse_real.double(), real_lse(q, k, **kw), atol=2e-6, rtol=0)


def test_lse_real_under_autograd_with_a_mask_and_with_a_cache():
    q, k, v, sink, _ = lse_inputs(1)
    q.requires_grad_(True)
    res = sink_attention(q, k, v, sink=sink, return_lse=True)  # recording: the fused op gives no lse
    torch.testing.assert_close(res.lse_real.double(), real_lse(q.detach(), k), atol=2e-6, rtol=0)
    allowed = visible_mask(LSE_T, 6, Tk=LSE_T)[None, None].repeat(LSE_B, 1, 1, 1)
    allowed[1, :, :, :3] = False
    allowed[1, :, :3, 0] = True
    mask = torch.zeros(LSE_B, 1, LSE_T, LSE_T).masked_fill(~allowed, torch.finfo(torch.float32).min)
    with torch.no_grad():
        got = sink_attention(q, k, v, sink=sink, mask=mask, return_lse=True).lse_real
    torch.testing.assert_close(got.double(), real_lse(q.detach(), k, mask=mask), atol=2e-6, rtol=0)
    with torch.no_grad():  # the last 5 queries over all keys (a cache)
        got = sink_attention(q[:, -5:], k, v, sink=sink, window=6, return_lse=True).lse_real
    torch.testing.assert_close(got.double(), real_lse(q.detach()[:, -5:], k, window=6), atol=2e-6, rtol=0)


def test_blocked_lse_equals_the_whole_one_with_broadcast_masks():
    q, k, _, _, bias = lse_inputs(2, torch.float64)
    mask = torch.zeros(LSE_B, 1, 1, LSE_T, dtype=torch.float64)
    mask[1, ..., :4] = float("-inf")  # key padding broadcast over queries (rows 0-3 of sequence 1 see nothing)
    for kw in (dict(window=4, keep=2), dict(key_bias=bias, mask=mask), dict(softcap=2.0)):
        whole = attention_probs(q, k, **kw)[2]
        torch.testing.assert_close(real_lse_blocked(q, k, block=8, **kw), whole, atol=1e-12, rtol=0)


@pytest.mark.parametrize("with_sink", [False, True])
def test_lse_real_of_an_edited_call_is_the_edited_attentions(with_sink):
    """Under a key-0 knockout edit the lse excludes key 0 (without a phantom query 0 keeps its clean row; with one
    it sees no real key: -inf); under an eviction it is over the kept first keys and the window."""
    q, k, v, sink, _ = lse_inputs(3)
    sink = sink if with_sink else None
    for edit, visible in [
        (edits.AttentionEdit(knockout=True), visible_mask(LSE_T, None) & (torch.arange(LSE_T)[None, :] > 0)),
        (edits.AttentionEdit(keep=2, window=4), visible_mask(LSE_T, 4, keep=2)),
    ]:
        got = sink_attention(q, k, v, sink=sink, return_lse=True, edit=edit).lse_real
        mask = torch.zeros(LSE_T, LSE_T, dtype=torch.float64).masked_fill(~visible, float("-inf"))
        want = real_lse(q, k, mask=mask)
        if edit.knockout and sink is None:
            want[:, :, 0] = real_lse(q[:, :1], k[:, :1])[:, :, 0]
        torch.testing.assert_close(got.double(), want, atol=2e-6, rtol=0)


def test_the_fallback_lse_is_well_conditioned():
    """Where the fused op had the phantom among its keys, the real lse is log(real mass) + L, the real mass summed by
    the row-mass op: exact even when the phantom takes all but 1e-11 of each row."""
    q, k, _, _, bias = lse_inputs(40)
    sink = torch.full((LSE_H,), 30.0)
    got = fallback_real_lse(q, k, sink, bias, None, 5, LSE_DH**-0.5, None, "auto")
    torch.testing.assert_close(got.double(), real_lse(q, k, key_bias=bias, window=5), atol=2e-5, rtol=0)


@pytest.mark.parametrize("backend", ["reference", "auto"])
def test_lse_real_of_fp64_inputs_is_fp64(backend):
    """An fp64 model (the authors' golden comparisons) with a phantom: the fallback keeps fp64."""
    q, k, v, sink, bias = lse_inputs(50, torch.float64)
    res = sink_attention(q, k, v, sink=sink, key_bias=bias, return_lse=True, backend=backend)
    assert res.lse_real.dtype == torch.float64
    torch.testing.assert_close(res.lse_real, real_lse(q, k, key_bias=bias), atol=1e-12, rtol=0)
