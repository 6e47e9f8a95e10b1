"""The fused torch paths (SDPA with phantom coordinates, CPU flash row masses) against the fp32 reference."""

import itertools

import pytest
import torch

from probe.kernels import attention_row_masses, sink_attention
from probe.kernels.row_masses.chunked import row_masses_chunked
from tests.support.gates import TRANSFORMS, gated

SINKS = [None, float("-inf"), 0.0, 100.0, -100.0]


def make_inputs(B=2, T=7, H=4, Hkv=2, dh=8, dv=6, sink_value=None, key_bias=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    leaf = lambda *s: torch.randn(*s, generator=g).requires_grad_()  # noqa: E731
    x = dict(
        q=leaf(B, T, H, dh),
        k=leaf(B, T, Hkv, dh),
        v=leaf(B, T, Hkv, dv),
        tau=(0.5 + 0.3 * torch.randn(Hkv, generator=g)).requires_grad_(),
        w=leaf(Hkv, dv),
        b=leaf(Hkv),
    )
    if sink_value is not None:  # mixed per-head sinks around the tested value
        x["sink"] = torch.tensor([sink_value, 0.3, sink_value, -2.0][:H] + [0.0] * (H - 4)).requires_grad_()
    if key_bias:
        x["key_bias"] = leaf(B, Hkv, T)
    return x


def run(x, backend, transform="none", **kw):
    """The attention op on the values and key bias that the value gate ``transform`` (parameters x's tau, w, b)
    gives."""
    v, key_bias, _ = gated(transform, x["v"], x.get("key_bias"), tau=x["tau"], w=x["w"], b=x["b"])
    return sink_attention(x["q"], x["k"], v, sink=x.get("sink"), key_bias=key_bias, backend=backend, **kw)


def grads(out, x, cot):
    names = list(x)
    gs = torch.autograd.grad(out, [x[n] for n in names], cot, allow_unused=True)
    return dict(zip(names, gs))


GRID = list(itertools.product(TRANSFORMS, SINKS, [None, 3], [(4, 2), (2, 2)], [False, True]))


@pytest.mark.parametrize("transform,sink_value,window,heads,key_bias", GRID)
def test_sdpa_matches_reference(transform, sink_value, window, heads, key_bias):
    x = make_inputs(H=heads[0], Hkv=heads[1], sink_value=sink_value, key_bias=key_bias)
    ref = run(x, "reference", transform=transform, window=window)
    fast = run(x, "sdpa", transform=transform, window=window)
    torch.testing.assert_close(fast.out, ref.out, atol=2e-6, rtol=1e-5)
    cot = torch.randn_like(ref.out)
    g_ref, g_fast = grads(ref.out, x, cot), grads(fast.out, x, cot)
    for name in x:
        if g_ref[name] is None:
            assert g_fast[name] is None or not g_fast[name].any(), name
            continue
        torch.testing.assert_close(
            g_fast[name], g_ref[name], atol=2e-5, rtol=1e-4, msg=lambda m, name=name: f"d{name}: {m}"
        )
    if sink_value == float("-inf"):
        assert not g_ref["sink"][0] and not g_fast["sink"][0]  # a -inf sink gets no gradient


@pytest.mark.parametrize("sink_value,keep,window", [(None, 0, 2), (None, 1, 2), (0.0, 2, 3), (-100.0, 4, 1)])
def test_sdpa_kept_first_keys_matches_reference(sink_value, keep, window):
    """The kept-first-keys rule (window eviction) on the CPU path: outputs and gradients equal the reference's."""
    x = make_inputs(T=11, sink_value=sink_value, key_bias=True)
    ref = run(x, "reference", window=window, keep=keep)
    fast = run(x, "sdpa", window=window, keep=keep)
    torch.testing.assert_close(fast.out, ref.out, atol=2e-6, rtol=1e-5)
    cot = torch.randn_like(ref.out)
    g_ref, g_fast = grads(ref.out, x, cot), grads(fast.out, x, cot)
    for name in ("q", "k", "v", "key_bias") + (("sink",) if sink_value is not None else ()):
        torch.testing.assert_close(
            g_fast[name], g_ref[name], atol=2e-5, rtol=1e-4, msg=lambda m, name=name: f"d{name}: {m}"
        )


@pytest.mark.parametrize("key_bias", [True, False])  # extra coordinates / the flash kernel's rows rescaled
def test_sdpa_lse_only_without_autograd(key_bias):
    x = make_inputs(sink_value=0.0, key_bias=key_bias)
    ref = run(x, "reference", transform="norm")
    assert run(x, "sdpa", transform="norm").lse is None  # the fused kernel's lse has no gradient
    with torch.no_grad():
        lse = run(x, "sdpa", transform="norm").lse
    torch.testing.assert_close(lse, ref.lse)


def test_causal_sink_path_copies_nothing(monkeypatch):
    """A causal sink with no key bias runs the flash kernel on q, k, v as they are: no phantom row or coordinate."""
    x = make_inputs(dh=8, dv=8, sink_value=1.0)
    ref = run(x, "reference")

    def no_cat(*a, **k):
        raise AssertionError("torch.cat called: the phantom was folded in as a copy")

    monkeypatch.setattr(torch, "cat", no_cat)
    fast = run(x, "sdpa")
    monkeypatch.undo()
    torch.testing.assert_close(fast.out, ref.out, atol=2e-6, rtol=1e-5)


def test_sdpa_scale_and_wide_values():
    x = make_inputs(dh=8, dv=20, sink_value=1.0)
    ref = run(x, "reference", scale=0.7, window=4)
    torch.testing.assert_close(run(x, "sdpa", scale=0.7, window=4).out, ref.out, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("key_bias", [True, False])
def test_sdpa_bf16_close_to_fp32_reference(key_bias):
    x = make_inputs(sink_value=0.5, key_bias=key_bias)
    ref = run(x, "reference", transform="silu")
    v, key_bias, _ = gated("silu", x["v"].bfloat16(), x.get("key_bias"))
    low = sink_attention(x["q"].bfloat16(), x["k"].bfloat16(), v, sink=x["sink"], key_bias=key_bias, backend="sdpa")
    assert low.out.dtype == torch.bfloat16
    torch.testing.assert_close(low.out.float(), ref.out, atol=3e-2, rtol=3e-2)


# ---------------------------------------------------------------- attention_row_masses


def masses_inputs(sink_value, window, key_bias, T=9, seed=1):
    x = make_inputs(T=T, sink_value=sink_value, key_bias=key_bias, seed=seed)
    ind = torch.zeros(2, T, 2, 3)
    ind[:, 0, :, 0] = 1.0  # key 0
    ind[:, :, :, 1] = (torch.rand(2, T, 2) < 0.5).float()  # a random key set
    ind[:, :, :, 2] = 1.0  # all real keys
    with torch.no_grad():
        ref = run(x, "reference", window=window, return_pattern=True)
    return x, ind, ref


@pytest.mark.parametrize("sink_value", SINKS)
@pytest.mark.parametrize("window", [None, 4])
@pytest.mark.parametrize("backend", ["auto", "torch", "reference", "chunked"])
def test_row_masses_match_pattern(sink_value, window, backend):
    x, ind, ref = masses_inputs(sink_value, window, key_bias=sink_value == 0.0)
    kw = dict(sink=x.get("sink"), key_bias=x.get("key_bias"), window=window)
    with torch.no_grad():
        if backend == "chunked":
            lse, masses = row_masses_chunked(x["q"], x["k"], ind, scale=8**-0.5, chunk=4, **kw)
        else:
            lse, masses = attention_row_masses(x["q"], x["k"], ind, backend=backend, **kw)
    assert masses.shape == (2, 4, 9, 3) and masses.dtype == torch.float32 and lse.dtype == torch.float32
    torch.testing.assert_close(lse, ref.lse, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(masses[..., 0], ref.pattern[..., 0], atol=1e-6, rtol=1e-5)
    expected = torch.einsum("bhij,bjh->bhi", ref.pattern, ind[..., 1].repeat_interleave(2, dim=2))
    torch.testing.assert_close(masses[..., 1], expected, atol=1e-6, rtol=1e-5)
    phantom = torch.exp(x["sink"].detach()[None, :, None] - lse) if "sink" in x else torch.zeros_like(lse)
    torch.testing.assert_close(phantom, ref.phantom, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(masses[..., 2] + phantom, torch.ones_like(lse), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("sink_value", [None, 0.0, 100.0])
@pytest.mark.parametrize("queries", [7, 3])  # all, or the last 3 over 7 keys (a cache)
def test_sdpa_with_a_callers_mask_matches_reference(sink_value, queries):
    """HF's additive masks (causal, a window, left padding as the finite minimum) and caches: values and gradients."""
    x = make_inputs(sink_value=sink_value, key_bias=True)
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
