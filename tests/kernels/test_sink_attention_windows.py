"""The sink-attention op at stream length (docs/definitions.md#window-eviction): the windowed SDPA path in query blocks
(no Tq x Tk tensor) against the reference, outputs, lse and gradients; eviction at positions within the cache against
each query's cache re-encoded explicitly; key-0 knockout by slicing against the per-key bias, every output."""

from __future__ import annotations

import pytest
import torch

from probe.kernels import sink_attention
from probe.kernels.sink_attention import edits, sdpa
from probe.kernels.sink_attention.kept import rerotate

B, H, HKV, DH = 2, 4, 2, 8
SINK = torch.tensor([0.5, -1.0, float("-inf"), 2.0], dtype=torch.float64)


def inputs(T, Tq=None, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Tq or T, H, DH, generator=g, dtype=dtype)
    return q, torch.randn(B, T, HKV, DH, generator=g, dtype=dtype), torch.randn(B, T, HKV, DH, generator=g, dtype=dtype)


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(sdpa, "QUERY_BLOCK", 16)


@pytest.mark.parametrize(
    "window,keep,Tq", [(3, None, None), (5, 2, None), (20, 4, None), (7, None, 30), (4, 3, 50), (100, None, None)]
)
@pytest.mark.parametrize("with_sink", [False, True])
def test_windowed_sdpa_in_query_blocks_equals_the_reference(window, keep, Tq, with_sink, small_blocks):
    """Blocks of 16 queries over T = 70 keys (a cache when Tq < T): outputs, lse and every gradient."""
    T = 70
    q, k, v = (x.requires_grad_() for x in inputs(T, Tq))
    bias = torch.randn(B, HKV, T, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).requires_grad_()
    sink = SINK.clone().requires_grad_() if with_sink else None
    kw = dict(sink=sink, key_bias=bias, window=window, keep=keep)
    got = sink_attention(q, k, v, backend="sdpa", **kw).out
    want = sink_attention(q, k, v, backend="reference", **kw).out
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)  # SDPA's sink and bias coordinates are fp32
    g = torch.randn_like(want)
    leaves = [x for x in (q, k, v, bias, sink) if x is not None]
    for a, b in zip(torch.autograd.grad(got, leaves, g), torch.autograd.grad(want, leaves, g)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    with torch.no_grad():
        lse = sink_attention(q, k, v, backend="sdpa", **kw).lse
        want_lse = sink_attention(q, k, v, backend="reference", **kw).lse
        torch.testing.assert_close(lse.double(), want_lse, atol=1e-6, rtol=0)


def test_the_windowed_path_builds_nothing_t_by_t(small_blocks, monkeypatch):
    """No tensor with two axes of at least T/2 (the blocks' masks are 16 x (kept + 16 + window - 1))."""
    from tests.checkpoints.test_long_context import NoSquare

    q, k, v = inputs(200, dtype=torch.float32)
    with torch.no_grad(), NoSquare(100):
        sink_attention(q, k, v, window=8, keep=4, backend="sdpa")
        sink_attention(q, k, v, backend="sdpa", edit=edits.AttentionEdit(keep=4, window=8))


def rope(T, dims=6, base=100.0):
    """inv_freq over ``dims`` of DH coordinates (partial rotary) and its (cos, sin) tables at 0 .. T-1, fp64."""
    inv = 1.0 / base ** (torch.arange(0, dims, 2, dtype=torch.float64) / dims)
    angle = torch.arange(T, dtype=torch.float64)[:, None] * inv
    return inv, (angle.cos(), angle.sin())


def rotate(x, positions, inv):
    """x (B,T,H,dh) rotate-half at ``positions`` (T,) over the first 2 len(inv) coordinates."""
    angle = positions.double()[:, None] * inv
    c, s = angle.cos()[None, :, None], angle.sin()[None, :, None]
    h = inv.shape[0]
    x1, x2, rest = x[..., :h], x[..., h : 2 * h], x[..., 2 * h :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s, rest], -1)


def reencoded(q_raw, k_raw, v, inv, keep, window, own=None, sink=None):
    """Each query's cache built and rotated explicitly: kept keys j < keep at j, the window after them, the query at
    min(t, keep + window - 1); the layer's own window counts the distance within the cache. -> (out, pattern)."""
    T = q_raw.shape[1]
    G = H // HKV
    out = torch.zeros(B, T, H, DH, dtype=torch.float64)
    pattern = torch.zeros(B, H, T, T, dtype=torch.float64)
    for i in range(T):
        p = min(i, keep + window - 1)
        js = [j for j in range(i + 1) if j > i - window or j < keep]
        at = [j if (j < keep and j <= i - window) else j - i + p for j in js]
        if own is not None:
            js, at = zip(*[(j, c) for j, c in zip(js, at) if p - c < own])
        js, at = list(js), torch.tensor(at)
        qq = rotate(q_raw[:, i : i + 1], torch.tensor([p]), inv)[:, 0]  # (B, H, dh)
        kk = rotate(k_raw[:, js], at, inv).repeat_interleave(G, 2)
        s = torch.einsum("bhd,bnhd->bhn", qq, kk) / DH**0.5
        if sink is not None:
            s = torch.cat([sink[None, :, None].expand(B, H, 1), s], -1)
        a = torch.softmax(s, -1)
        a = a[..., 1:] if sink is not None else a
        pattern[:, :, i, js] = a
        out[:, i] = torch.einsum("bhn,bnhd->bhd", a, v[:, js].repeat_interleave(G, 2))
    return out, pattern


@pytest.mark.parametrize("keep,window,own", [(2, 5, None), (4, 8, 10), (1, 3, 30), (0, 6, None), (3, 4, 5)])
@pytest.mark.parametrize("backend", ["reference", "sdpa"])
@pytest.mark.parametrize("with_sink", [False, True])
def test_cache_positions_equal_each_querys_cache_reencoded(keep, window, own, backend, with_sink, small_blocks):
    T = 40
    q_raw, k_raw, v = inputs(T, seed=3)
    inv, tables = rope(T)
    t = torch.arange(T)
    q, k = rotate(q_raw, t, inv), rotate(k_raw, t, inv)  # what hook_rot_q / hook_rot_k carry: rotated in the text
    sink = SINK if with_sink else None
    want, want_pattern = reencoded(q_raw, k_raw, v, inv, keep, window, own, sink)
    edit = edits.AttentionEdit(keep=keep, window=window, positions="cache", rotary=tables)
    res = sink_attention(
        q, k, v, sink=sink, window=own, backend=backend, return_pattern=backend == "reference", edit=edit
    )
    torch.testing.assert_close(res.out, want, atol=1e-6 if backend == "sdpa" else 1e-12, rtol=0)
    if res.pattern is not None:
        torch.testing.assert_close(res.pattern, want_pattern, atol=1e-12, rtol=0)
        torch.testing.assert_close(res.pattern.sum(-1) + res.phantom, torch.ones(B, H, T, dtype=torch.float64))


@pytest.mark.parametrize("keep,window", [(0, 40), (4, 36), (40, 1)])
def test_cache_positions_with_k_plus_w_covering_the_sequence_are_the_clean_op(keep, window):
    T = 40
    q, k, v = inputs(T, seed=4)
    edit = edits.AttentionEdit(keep=keep, window=window, positions="cache", rotary=rope(T)[1])
    out = sink_attention(q, k, v, sink=SINK, backend="sdpa", edit=edit).out
    torch.testing.assert_close(out, sink_attention(q, k, v, sink=SINK, backend="sdpa").out, atol=0, rtol=0)


def test_rerotation_composes_rotations():
    """q rotated at t, re-rotated to t', equals q rotated at t' directly; a partial rotary leaves the rest alone."""
    T = 30
    q_raw = inputs(T)[0]
    inv, tables = rope(T)
    t = torch.arange(T)
    to = (t * 7) % T
    torch.testing.assert_close(rerotate(rotate(q_raw, t, inv), tables, t, to), rotate(q_raw, to, inv))


@pytest.mark.parametrize("with_sink", [False, True])
@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("backend", ["reference", "sdpa"])
def test_knockout_by_slicing_equals_the_per_key_bias(with_sink, window, backend):
    """Key 0 out of every KV head (queries and keys 1 .. T-1) against key 0's logit at -inf for every chosen KV head
    (the per-key bias path): outputs, lse, real-key lse, pattern and phantom."""
    T = 25
    q, k, v = inputs(T, seed=5)
    sink = SINK if with_sink else None
    got, want = [], []
    for heads, into in ((None, got), (tuple(range(HKV)), want)):
        into.append(
            sink_attention(
                q,
                k,
                v,
                sink=sink,
                window=window,
                backend=backend,
                return_lse=True,
                return_pattern=backend == "reference",
                edit=edits.AttentionEdit(knockout=True, kv_heads=heads),
            )
        )
    for a, b, name in zip(got[0], want[0], got[0]._fields):
        if b is None:
            continue
        tol = 1e-6 if backend == "sdpa" else 1e-12
        torch.testing.assert_close(a.double(), b.double(), atol=tol, rtol=0, msg=name)
