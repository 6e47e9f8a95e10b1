"""depth_attention (probe/kernels/depth_attention/): the reference loop against the formula, merge_depth, then the
Triton kernels (CUDA or the interpreter) against the reference on outputs and every gradient: S-LR view keys, P-LR
separate keys, AttnRes keys r = d, with and without a bias and the keys' RMSNorm."""

import math

import pytest
import torch

from probe.kernels import depth_attention, merge_depth
from tests.kernels.interpreter import CUDA, DEV, FRESH_PROCESS, TRITON, leaf, needs_triton, rerun_in_fresh_process


@pytest.mark.skipif(not FRESH_PROCESS, reason="the Triton cases run in this process")
def test_triton_in_fresh_process(request):
    rerun_in_fresh_process(request, __file__)


def rand_sources(S=4, B=2, T=3, d=8, r=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, T, d, generator=g) for _ in range(S)], [torch.randn(B, T, r, generator=g) for _ in range(S)]


@pytest.mark.parametrize("normalize", [True, False])
def test_reference_matches_formula(normalize):
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


def test_one_source_is_identity_and_slr_full_rank_is_attnres():
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


def test_backend_and_shape_errors():
    with pytest.raises(ValueError, match="backend"):
        depth_attention(*rand_sources(), torch.randn(4), backend="cuda")
    values, keys = rand_sources()
    with pytest.raises(ValueError, match="keys"):
        depth_attention(values, keys[:2], torch.randn(4))
    with pytest.raises(ValueError, match="bias"):
        depth_attention(values, keys, torch.randn(4), bias=torch.zeros(3))


# ---------------------------------------------------------------- every backend against the reference


def depth_inputs(S, B, T, d, r, view_keys, bias, seed=0):
    """S sub-layer outputs (non-leaf values), their keys (views of the values, or leaves of their own), a query with
    logits of std ~2, a bias; and the leaves whose gradients are compared."""
    g = torch.Generator().manual_seed(seed)
    base = [leaf(g, B, T, d) for _ in range(S)]
    values = [x * 1.0 for x in base]
    keys = [v[..., -r:] for v in values] if view_keys else [leaf(g, B, T, r) for _ in range(S)]
    leaves = base + ([] if view_keys else keys)
    query = (2.0 / r**0.5 * torch.randn(r, generator=g)).to(DEV).requires_grad_()
    b = leaf(g, S) if bias else None
    return values, keys, query, b, leaves + [query] + ([b] if bias else [])


def compare_with_reference(backend, S, B, T, d, r, view_keys, bias, normalize, atol=2e-5, rtol=1e-4):
    """``backend`` against the reference: h, lse, the weights, and the gradient of every leaf."""
    values, keys, query, b, leaves = depth_inputs(S, B, T, d, r, view_keys, bias)
    kw = dict(bias=b, normalize=normalize, return_weights=True)
    ref = depth_attention(values, keys, query, backend="reference", **kw)
    got = depth_attention(values, keys, query, backend=backend, **kw)
    for a, b_ in ((got.h, ref.h), (got.lse, ref.lse), (got.weights, ref.weights)):
        torch.testing.assert_close(a, b_, atol=atol, rtol=rtol)
    cot_h, cot_lse = torch.randn_like(ref.h), torch.randn_like(ref.lse)
    g_ref = torch.autograd.grad((ref.h * cot_h).sum() + (ref.lse * cot_lse).sum(), leaves, retain_graph=True)
    g_got = torch.autograd.grad((got.h * cot_h).sum() + (got.lse * cot_lse).sum(), leaves)
    for i, (a, b_) in enumerate(zip(g_got, g_ref)):
        torch.testing.assert_close(a, b_, atol=atol, rtol=rtol, msg=lambda m, i=i: f"leaf {i}: {m}")
    return got


# (S, B, T, d, r, view_keys, bias, normalize): S-LR views, P-LR separate keys, d spanning several 16-blocks, r = d
DEPTH_GRID = [
    (1, 2, 5, 8, 8, False, False, True),
    (3, 2, 7, 24, 4, True, True, True),
    (6, 1, 19, 40, 8, False, True, True),
    (4, 2, 9, 16, 16, True, False, True),
    (5, 1, 17, 33, 5, False, True, False),
    (2, 3, 6, 64, 32, True, True, True),
]


@pytest.mark.parametrize("backend", [TRITON])
@pytest.mark.parametrize("S,B,T,d,r,view_keys,bias,normalize", DEPTH_GRID)
def test_triton_matches_reference(backend, S, B, T, d, r, view_keys, bias, normalize):
    got = compare_with_reference(backend, S, B, T, d, r, view_keys, bias, normalize)
    assert got.h.shape == (B, T, d) and got.lse.dtype == torch.float32


@pytest.mark.parametrize("backend", [TRITON])
@pytest.mark.parametrize("view_keys,bias,normalize", [(False, True, True), (False, True, False), (True, False, True)])
def test_one_source_gives_exact_zero_gradients_as_the_reference(backend, view_keys, bias, normalize):
    """One source (the read of the first layer, L = 1): its weight is 1 whatever its score, so a loss on h alone has
    gradients exactly 0 for the query, the keys and the bias, and dvalues = dh; the reference's autograd gives exact
    zeros and so must the kernel (not rounding residue). With the lse in the loss, d score = dlse, as the reference."""
    values, keys, query, b, leaves = depth_inputs(1, 2, 5, 40, 8, view_keys, bias)  # d = 40: three 16-wide d blocks
    scored = [query] + ([] if view_keys else keys) + ([b] if bias else [])
    cot = torch.randn(2, 5, 40, generator=torch.Generator().manual_seed(1)).to(DEV)
    res = {}
    for name in ("reference", backend):
        out = depth_attention(values, keys, query, bias=b, normalize=normalize, backend=name)
        res[name] = torch.autograd.grad((out.h * cot).sum(), leaves, retain_graph=True), out
    for name in ("reference", backend):
        grads = dict(zip(map(id, leaves), res[name][0]))
        for t in scored:
            assert torch.equal(grads[id(t)], torch.zeros_like(t)), (name, float(grads[id(t)].abs().max()))
    for a, b_ in zip(*(res[name][0] for name in (backend, "reference"))):
        torch.testing.assert_close(a, b_, atol=2e-5, rtol=1e-4)  # dvalues = dh
    with_lse = {}
    for name in ("reference", backend):
        out = res[name][1]
        with_lse[name] = torch.autograd.grad((out.h * cot).sum() + out.lse.sum(), scored)
    for a, b_ in zip(with_lse[backend], with_lse["reference"]):
        assert b_.abs().max() > 0
        torch.testing.assert_close(a, b_, atol=2e-5, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("backend", [TRITON])
@pytest.mark.parametrize("S,d,r", [(13, 96, 16), (25, 128, 128), (9, 200, 24)])
def test_triton_matches_reference_slow_grid(backend, S, d, r):
    compare_with_reference(backend, S, 2, 33, d, r, False, True, True)
    compare_with_reference(backend, S, 2, 33, d, r, True, True, True)


@needs_triton
def test_triton_one_source_identity_and_no_stacking(monkeypatch):
    from probe.kernels.depth_attention import triton as depth_triton

    values, keys, query, _, _ = depth_inputs(3, 2, 5, 8, 8, True, False)
    stacked = []
    monkeypatch.setattr(torch, "stack", lambda *a, **k: stacked.append(1) or torch.cat([t[None] for t in a[0]]))
    with torch.no_grad():
        h, lse = depth_triton.depth_attention_triton(values[:1], keys[:1], query)
        depth_triton.depth_attention_triton(values, keys, query)
    assert torch.equal(h, values[0]) and not stacked


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_triton_fp32_large():
    compare_with_reference("triton", 20, 4, 512, 256, 32, True, True, True, atol=1e-4, rtol=1e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_triton_bf16():
    values, keys, query, b, _ = depth_inputs(12, 4, 256, 512, 32, True, True)
    ref = depth_attention(values, keys, query, bias=b, backend="reference")
    low = [v.detach().bfloat16() for v in values]
    tri = depth_attention(low, [v[..., -32:] for v in low], query, bias=b, backend="triton")
    torch.testing.assert_close(tri.h.float(), ref.h, atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(tri.lse, ref.lse, atol=3e-2, rtol=3e-2)
