"""probe.kernels references against explicit formulas, invariants, merge, dispatch errors, torch-only import."""

import math
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from probe.kernels import BACKENDS, attention_row_masses, depth_attention, merge_depth, sink_attention
from probe.models import ProbeConfig
from tests.support.gates import gated

SINKS = [None, float("-inf"), 0.0, 100.0, -100.0]


def rand_qkv(B=2, T=6, H=4, Hkv=2, dh=8, dv=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(B, T, H, dh, generator=g),
        torch.randn(B, T, Hkv, dh, generator=g),
        torch.randn(B, T, Hkv, dv, generator=g),
    )


def naive_attention(q, k, v, *, sink=None, key_bias=None, window=None, log_gate=None, softcap=None):
    """Row by row in float64 with Python exp: the phantom enters the normaliser with value 0. softcap bends the q.k
    score only (Gemma 2: cap tanh(s / cap)); biases and the sink are added uncapped."""
    B, T, H, dh = q.shape
    G = H // k.shape[2]
    out = torch.zeros(B, T, H, v.shape[-1], dtype=torch.float64)
    pattern = torch.zeros(B, H, T, T, dtype=torch.float64)
    phantom = torch.zeros(B, H, T, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                js = [j for j in range(T) if j <= i and (window is None or j > i - window)]
                logit = {j: float(q[b, i, h].double() @ k[b, j, h // G].double()) / math.sqrt(dh) for j in js}
                if softcap is not None:
                    logit = {j: softcap * math.tanh(x / softcap) for j, x in logit.items()}
                for j in js:
                    logit[j] += 0.0 if key_bias is None else float(key_bias[b, h // G, j])
                    logit[j] += 0.0 if log_gate is None else float(log_gate[b, j, h // G])
                top = max(list(logit.values()) + ([float(sink[h])] if sink is not None else []))
                z = sum(math.exp(x - top) for x in logit.values())
                z += math.exp(float(sink[h]) - top) if sink is not None else 0.0
                for j in js:
                    pattern[b, h, i, j] = math.exp(logit[j] - top) / z
                    out[b, i, h] += pattern[b, h, i, j] * v[b, j, h // G].double()
                phantom[b, h, i] = math.exp(float(sink[h]) - top) / z if sink is not None else 0.0
    return out, pattern, phantom


# ---------------------------------------------------------------- value gates (what the kernels are given)


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


# ---------------------------------------------------------------- sink attention reference


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


@pytest.mark.parametrize("sink_value", [None, 0.0, 100.0])
@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("backend", ["reference", "torch", "chunked"])
def test_softcapped_row_masses_match_naive(sink_value, window, backend):
    """Gemma 2's cap on every torch path (the CPU flash op cannot cap: torch takes the chunked path), with GQA, a
    key bias and a sink; chunks of 4 over 9 positions cross block edges. A cap of 1 moves the masses by far more
    than the tolerance (checked), so the cap is applied, not skipped."""
    from probe.kernels.row_masses.chunked import row_masses_chunked

    q, k, v = rand_qkv(T=9)
    q = 2 * q  # scores of several units: the cap bends them
    sink = None if sink_value is None else torch.tensor([sink_value, 0.5, -1.0, sink_value])
    key_bias = torch.randn(2, 2, 9, generator=torch.Generator().manual_seed(1))
    ind = torch.zeros(2, 9, 2, 2)
    ind[:, 0, :, 0] = 1.0  # key 0
    ind[:, :, :, 1] = (torch.rand(2, 9, 2, generator=torch.Generator().manual_seed(2)) < 0.5).float()
    kw = dict(sink=sink, key_bias=key_bias, window=window)
    _, pattern, phantom = naive_attention(q, k, v, softcap=1.0, **kw)
    if backend == "chunked":
        lse, masses = row_masses_chunked(q, k, ind, scale=8**-0.5, softcap=1.0, chunk=4, **kw)
    else:
        lse, masses = attention_row_masses(q, k, ind, softcap=1.0, backend=backend, **kw)
    want = torch.einsum("bhij,bjhc->bhic", pattern, ind.double().repeat_interleave(2, dim=2))  # (B, H, T, 2)
    torch.testing.assert_close(masses.double(), want, atol=1e-6, rtol=1e-5)
    if sink is not None:
        torch.testing.assert_close(torch.exp(sink[None, :, None] - lse).double(), phantom, atol=1e-6, rtol=1e-5)
    _, uncapped = attention_row_masses(q, k, ind, backend=backend if backend != "chunked" else "torch", **kw)
    assert (uncapped.double() - want).abs().max() > 0.05


@pytest.mark.parametrize("softcap", [0.0, -1.0, float("inf"), float("nan"), "2"])
def test_bad_softcap_is_refused(softcap):
    q, k, v = rand_qkv()
    with pytest.raises(ValueError, match=f"softcap must be a positive finite number or None, got {softcap!r}"):
        attention_row_masses(q, k, v, softcap=softcap)


# ---------------------------------------------------------------- depth attention reference and merge


def rand_sources(S=4, B=2, T=3, d=8, r=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, T, d, generator=g) for _ in range(S)], [torch.randn(B, T, r, generator=g) for _ in range(S)]


@pytest.mark.parametrize("normalize", [True, False])
def test_depth_reference_matches_formula(normalize):
    values, keys = rand_sources()
    query, bias = torch.randn(4), torch.randn(4)
    res = depth_attention(values, keys, query, bias=bias, normalize=normalize, return_weights=True, backend="torch")
    for bi in range(2):
        for t in range(3):
            logits = []
            for i in range(4):
                kk = keys[i][bi, t].double()
                if normalize:
                    kk = kk / math.sqrt(float(kk.square().mean()) + 1e-6)
                logits.append(float(kk @ query.double()) + float(bias[i]))  # no 1/sqrt(r)
            z = sum(math.exp(x) for x in logits)
            alpha = [math.exp(x) / z for x in logits]
            h = sum(a * values[i][bi, t].double() for i, a in enumerate(alpha))
            torch.testing.assert_close(res.h[bi, t].double(), h, atol=1e-5, rtol=1e-5)
            assert abs(float(res.lse[bi, t]) - math.log(z)) < 1e-5
            torch.testing.assert_close(
                res.weights[bi, t].double(), torch.tensor(alpha, dtype=torch.float64), atol=1e-6, rtol=1e-5
            )


def test_depth_one_source_is_identity_and_slr_full_rank_is_attnres():
    values, keys = rand_sources(S=1)
    res = depth_attention(values, keys, torch.randn(4))
    assert torch.equal(res.h, values[0])
    values, _ = rand_sources(S=5, d=8)
    query = torch.randn(8)
    attnres = depth_attention(values, values, query).h
    slr = depth_attention(values, [v[..., -8:] for v in values], query).h  # r = d: the sliced key is the value
    assert torch.equal(attnres, slr)


def test_merge_is_associative_and_equals_single_call():
    values, keys = rand_sources(S=6)
    query, bias = torch.randn(4), torch.randn(6)
    full = depth_attention(values, keys, query, bias=bias)
    parts = [depth_attention(values[a:b], keys[a:b], query, bias=bias[a:b]) for a, b in [(0, 2), (2, 5), (5, 6)]]
    left = merge_depth(*merge_depth(parts[0].h, parts[0].lse, parts[1].h, parts[1].lse), parts[2].h, parts[2].lse)
    right = merge_depth(parts[0].h, parts[0].lse, *merge_depth(parts[1].h, parts[1].lse, parts[2].h, parts[2].lse))
    for h, lse in (left, right):
        torch.testing.assert_close(h, full.h)
        torch.testing.assert_close(lse, full.lse)
    empty = (torch.zeros_like(full.h), torch.full_like(full.lse, float("-inf")))  # a partial with no sources
    h, lse = merge_depth(full.h, full.lse, *empty)
    assert torch.equal(h, full.h) and torch.equal(lse, full.lse)


# ---------------------------------------------------------------- dispatch and import


def test_backend_and_shape_errors():
    q, k, v = rand_qkv()
    assert set(BACKENDS) == {"auto", "torch", "reference", "sdpa", "triton"}
    with pytest.raises(ValueError, match="auto.*torch.*reference.*sdpa.*triton"):
        sink_attention(q, k, v, backend="flash")
    with pytest.raises(ValueError, match="pattern"):
        sink_attention(q, k, v, return_pattern=True, backend="sdpa")
    with pytest.raises(ValueError, match="multiple"):
        sink_attention(q[:, :, :3], k, v)
    with pytest.raises(ValueError, match="sink"):
        sink_attention(q, k, v, sink=torch.zeros(2))
    with pytest.raises(ValueError, match="backend"):
        depth_attention(*rand_sources(), torch.randn(4), backend="cuda")
    with pytest.raises(ValueError, match="backend"):
        attention_row_masses(q, k, v, backend="nope")
    values, keys = rand_sources()
    with pytest.raises(ValueError, match="keys"):
        depth_attention(values, keys[:2], torch.randn(4))


def test_dispatch_picks_reference_only_for_patterns():
    q, k, v = rand_qkv()
    for backend in ("auto", "torch"):
        with_pattern = sink_attention(q, k, v, return_pattern=True, backend=backend)
        assert with_pattern.pattern is not None and with_pattern.phantom is not None
        fast = sink_attention(q, k, v, backend=backend)
        assert fast.pattern is None and fast.phantom is None
        torch.testing.assert_close(fast.out, with_pattern.out)


def test_imports_and_runs_without_triton():
    code = """
import sys
sys.modules["triton"] = None  # any import of triton now raises ImportError
import torch
import probe.kernels as K
q, k, v = torch.randn(1, 5, 2, 4), torch.randn(1, 5, 1, 4), torch.randn(1, 5, 1, 4)
K.sink_attention(q, k, v, sink=torch.zeros(2))
K.depth_attention([v[:, :, 0]] * 2, [v[:, :, 0]] * 2, torch.randn(4))
K.attention_row_masses(q, k, v)
assert not K.triton_available()
try:
    K.sink_attention(q, k, v, backend="triton")
except RuntimeError as e:
    assert "triton" in str(e)
else:
    raise SystemExit("backend='triton' without triton should raise")
print("ok")
"""
    res = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(__import__("pathlib").Path(__file__).resolve().parents[2]),
    )
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


# ---------------------------------------------------------------- masks, caches and the runtime backend


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


def test_use_backend_is_read_when_an_op_runs(monkeypatch):
    from probe.kernels import current_backend, use_backend
    from probe.kernels.sink_attention import dispatch

    calls = []
    real = dispatch.sink_attention_reference
    monkeypatch.setattr(dispatch, "sink_attention_reference", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.delenv("PROBE_BACKEND", raising=False)
    q, k, v = rand_qkv()
    assert current_backend() == "auto"
    sink_attention(q, k, v)
    assert calls == []
    with use_backend("reference"):
        sink_attention(q, k, v)
        with use_backend("sdpa"):  # the innermost block
            assert current_backend() == "sdpa"
            sink_attention(q, k, v)
        with use_backend(None):  # no choice: the outer one stays
            sink_attention(q, k, v)
        sink_attention(q, k, v, backend="sdpa")  # an explicit argument wins
    assert len(calls) == 2 and current_backend() == "auto"
    monkeypatch.setenv("PROBE_BACKEND", "reference")
    sink_attention(q, k, v)
    assert len(calls) == 3
    with pytest.raises(ValueError, match="auto.*torch.*reference.*sdpa.*triton"):
        with use_backend("cuda"):
            pass
