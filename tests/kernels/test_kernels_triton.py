"""Triton kernels against the fp32 references: outputs and every gradient.

Without CUDA the kernels run under the Triton interpreter, which only works if TRITON_INTERPRET=1 is set before triton
is first imported. This module sets it at collection time when it can; when triton was already imported without it
(importing torch._dynamo does that, so any earlier test module may have), the kernel tests are skipped here and
re-run by one test in a fresh Python process with the variable set. Interpreter grids are tiny; larger grids are
marked slow and run only when selected (-m slow); bf16 and large shapes need a GPU.
"""

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA and "triton" not in sys.modules:
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the first import of triton
pytest.importorskip("triton")

from probe.kernels import attention_row_masses, depth_attention, sink_attention  # noqa: E402
from probe.kernels.depth_attention import triton as depth_triton  # noqa: E402
from probe.kernels.sink_attention import triton as sink_triton  # noqa: E402
from tests.support.gates import TRANSFORMS, gated  # noqa: E402

DEV = "cuda" if CUDA else "cpu"
FRESH_PROCESS = not CUDA and type(sink_triton._fwd_kernel).__name__ != "InterpretedFunction"
ROOT = Path(__file__).resolve().parents[2]
SINKS = [None, float("-inf"), 0.0, 100.0, -100.0]


@pytest.fixture(autouse=True)
def _placement(request):
    """Kernel tests run here only if the interpreter is on (or on CUDA); slow ones only when selected with -m."""
    if request.node.originalname == "test_kernels_in_fresh_process":
        return
    if FRESH_PROCESS:
        pytest.skip("triton was imported before TRITON_INTERPRET=1: run by test_kernels_in_fresh_process")
    if request.node.get_closest_marker("slow") and "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("large interpreter grid: run with -m slow")


@pytest.mark.skipif(not FRESH_PROCESS, reason="the kernel tests run in this process")
def test_kernels_in_fresh_process(request):
    markexpr = request.config.getoption("markexpr")
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-o",
        "addopts=",
        "-q",
        "-p",
        "no:cacheprovider",
        str(Path(__file__).resolve()),
    ]
    env = dict(
        os.environ,
        TRITON_INTERPRET="1",
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    )
    res = subprocess.run(
        cmd + (["-m", markexpr] if markexpr else []), cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600
    )
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-3000:]
    assert " passed" in res.stdout.strip().splitlines()[-1], res.stdout[-2000:]  # something ran


def leaf(g, *shape):
    return torch.randn(*shape, generator=g).to(DEV).requires_grad_()


def attention_inputs(B, T, H, Hkv, dh, dv, sink_value, key_bias, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = dict(
        q=leaf(g, B, T, H, dh),
        k=leaf(g, B, T, Hkv, dh),
        v=leaf(g, B, T, Hkv, dv),
        tau=(0.5 + 0.3 * torch.randn(Hkv, generator=g)).to(DEV).requires_grad_(),
        w=leaf(g, Hkv, dv),
        b=leaf(g, Hkv),
    )
    if sink_value is not None:
        x["sink"] = torch.tensor(([sink_value, 0.3, -2.0, sink_value] * H)[:H]).to(DEV).requires_grad_()
    if key_bias:
        x["key_bias"] = leaf(g, B, Hkv, T)
    return x


def check_attention(x, atol=2e-5, rtol=1e-4, transform="none", **kw):
    """Triton against the reference on the values and key bias of the value gate ``transform`` (x's tau, w, b)."""
    v, key_bias, _ = gated(transform, x["v"], x.get("key_bias"), tau=x["tau"], w=x["w"], b=x["b"])
    ref = sink_attention(x["q"], x["k"], v, sink=x.get("sink"), key_bias=key_bias, backend="reference", **kw)
    tri = sink_attention(x["q"], x["k"], v, sink=x.get("sink"), key_bias=key_bias, backend="triton", **kw)
    torch.testing.assert_close(tri.out, ref.out, atol=atol, rtol=rtol)
    torch.testing.assert_close(tri.lse, ref.lse, atol=atol, rtol=rtol)
    cot_out, cot_lse = torch.randn_like(ref.out), torch.randn_like(ref.lse)  # the kernel's lse is differentiable
    names = list(x)
    g_ref = torch.autograd.grad(
        (ref.out * cot_out).sum() + (ref.lse * cot_lse).sum(),
        [x[n] for n in names],
        allow_unused=True,
        retain_graph=True,
    )  # the gate's graph is shared with tri
    g_tri = torch.autograd.grad(
        (tri.out * cot_out).sum() + (tri.lse * cot_lse).sum(), [x[n] for n in names], allow_unused=True
    )
    for name, a, b in zip(names, g_tri, g_ref):
        if b is None:
            assert a is None or not a.any(), name
        else:
            torch.testing.assert_close(a, b, atol=atol, rtol=rtol, msg=lambda m, name=name: f"d{name}: {m}")


# (B, T, H, Hkv, dh, dv): T spans several 16-blocks and ends mid-block; GQA groups 1, 2, 3; dv != dh
SHAPES = [(1, 19, 2, 2, 8, 8), (2, 24, 4, 2, 16, 8), (1, 35, 3, 1, 8, 16)]


@pytest.mark.parametrize("shape,sink_value,window", list(itertools.product(SHAPES, SINKS, [None, 5])))
def test_sink_attention_triton(shape, sink_value, window):
    check_attention(attention_inputs(*shape, sink_value, key_bias=True), window=window)


# kept first keys: none, inside the first key block, spanning a block boundary (16), past the window's first block
@pytest.mark.parametrize(
    "shape,sink_value,keep",
    [(shape, sink, keep) for shape in SHAPES for sink, keep in ((None, 1), (0.5, 0), (0.5, 4), (None, 18))],
)
def test_sink_attention_triton_kept_first_keys(shape, sink_value, keep):
    """The kept-first-keys rule (StreamingLLM eviction) in the forward and both backward kernels: outputs and every
    gradient against the reference."""
    check_attention(attention_inputs(*shape, sink_value, key_bias=True), window=3, keep=keep)


@pytest.mark.parametrize("transform,key_bias", list(itertools.product(TRANSFORMS, [False, True])))
def test_sink_attention_triton_transforms(transform, key_bias):
    check_attention(attention_inputs(1, 21, 4, 2, 8, 8, 0.5, key_bias), transform=transform, window=9, scale=0.4)


@pytest.mark.slow
@pytest.mark.parametrize(
    "shape,sink_value,window,transform",
    list(itertools.product([(2, 70, 8, 2, 32, 32), (1, 100, 4, 4, 64, 48)], SINKS, [None, 1, 33], ["none", "proj"])),
)
def test_sink_attention_triton_slow_grid(shape, sink_value, window, transform):
    check_attention(attention_inputs(*shape, sink_value, key_bias=True), window=window, transform=transform)


@pytest.mark.parametrize("sink_value,window", [(None, None), (0.7, None), (float("-inf"), 6), (100.0, 6)])
def test_row_masses_triton(sink_value, window):
    x = attention_inputs(2, 20, 4, 2, 8, 8, sink_value, key_bias=True)
    ind = torch.zeros(2, 20, 2, 2, device=DEV)
    ind[:, 0, :, 0] = 1.0
    ind[:, :, :, 1] = 1.0
    kw = dict(sink=x.get("sink"), key_bias=x["key_bias"], window=window)
    with torch.no_grad():
        ref = sink_attention(x["q"], x["k"], x["v"], return_pattern=True, backend="reference", **kw)
        lse, masses = attention_row_masses(x["q"], x["k"], ind, backend="triton", **kw)
    torch.testing.assert_close(lse, ref.lse, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(masses[..., 0], ref.pattern[..., 0], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(masses[..., 1] + ref.phantom, torch.ones_like(lse), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("sink_value,window", [(None, None), (0.7, None), (100.0, 6)])
def test_triton_forward_lse_feeds_the_sparse_row_masses(sink_value, window):
    """return_lse on the Triton path: the kernel's own lse without a phantom, else the row-mass op's (Triton) real
    mass; the masses read from it equal the Triton row masses (docs/definitions.md#row-log-normaliser)."""
    x = attention_inputs(2, 20, 4, 2, 8, 8, sink_value, key_bias=True)
    ind = torch.zeros(2, 20, 2, 2, device=DEV)
    ind[:, 0, :, 0] = 1.0
    ind[:, :, :, 1] = 1.0
    kw = dict(sink=x.get("sink"), key_bias=x["key_bias"], window=window)
    with torch.no_grad():
        ref = sink_attention(x["q"], x["k"], x["v"], return_pattern=True, backend="reference", **kw)
        res = sink_attention(x["q"], x["k"], x["v"], return_lse=True, backend="triton", **kw)
        want = attention_row_masses(x["q"], x["k"], ind, backend="triton", **kw)[1]
        got = attention_row_masses(x["q"], x["k"], ind, lse=res.lse_real, backend="triton", **kw)[1]
    real = torch.log(ref.pattern.sum(-1)) + ref.lse  # the real keys' lse from the fp32 reference
    torch.testing.assert_close(res.lse_real, real, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def capped_masses(q, k, ind, sink, key_bias, window, softcap):
    """Explicit T x T, fp64: softmax over [sink, cap tanh(scale q.k / cap) + key_bias] on visible keys, @ indicators."""
    B, T, H, dh = q.shape
    G = H // k.shape[2]
    s = torch.einsum("bihd,bjhd->bhij", q.double(), k.double().repeat_interleave(G, 2)) / dh**0.5  # (B, H, T, T)
    s = softcap * torch.tanh(s / softcap) + key_bias.double().repeat_interleave(G, 1)[:, :, None, :]
    i, j = torch.arange(T, device=q.device)[:, None], torch.arange(T, device=q.device)[None, :]
    visible = (j <= i) if window is None else (j <= i) & (j > i - window)
    s = s.masked_fill(~visible, float("-inf"))
    if sink is not None:  # the phantom: one more logit, value 0
        s = torch.cat([sink.double()[None, :, None, None].expand(B, H, T, 1), s], -1)
    lse = s.logsumexp(-1)  # (B, H, T)
    a = torch.exp(s - lse[..., None])[..., -T:]  # the real keys' probabilities
    return lse, torch.einsum("bhij,bjhc->bhic", a, ind.double().repeat_interleave(G, 2))


@pytest.mark.parametrize("sink_value,window", [(None, None), (0.7, None), (100.0, 6)])
def test_row_masses_triton_softcap(sink_value, window):
    """Gemma 2's cap inside the kernel (2 sigmoid(2x) - 1 for tanh), with GQA, a key bias, a sink and a window."""
    x = attention_inputs(2, 20, 4, 2, 8, 8, sink_value, key_bias=True)
    q = 2 * x["q"].detach()  # scores of several units: a cap of 1 bends them
    ind = torch.zeros(2, 20, 2, 2, device=DEV)
    ind[:, 0, :, 0] = 1.0
    ind[:, :, :, 1] = (torch.rand(2, 20, 2, generator=torch.Generator().manual_seed(3)) < 0.5).float().to(DEV)
    sink = None if "sink" not in x else x["sink"].detach()
    kw = dict(sink=sink, key_bias=x["key_bias"].detach(), window=window)
    with torch.no_grad():
        lse, masses = attention_row_masses(q, x["k"], ind, softcap=1.0, backend="triton", **kw)
        _, uncapped = attention_row_masses(q, x["k"], ind, backend="triton", **kw)
    want_lse, want = capped_masses(q, x["k"].detach(), ind, softcap=1.0, **kw)
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(masses.double(), want, atol=1e-6, rtol=1e-5)
    assert (uncapped.double() - want).abs().max() > 0.05


# ---------------------------------------------------------------- depth attention


def depth_inputs(S, B, T, d, r, view_keys, bias, seed=0):
    g = torch.Generator().manual_seed(seed)
    base = [leaf(g, B, T, d) for _ in range(S)]
    values = [x * 1.0 for x in base]  # non-leaf, like sub-layer outputs
    keys = [v[..., -r:] for v in values] if view_keys else [leaf(g, B, T, r) for _ in range(S)]
    leaves = base + ([] if view_keys else keys)
    query = (2.0 / r**0.5 * torch.randn(r, generator=g)).to(DEV).requires_grad_()  # logits of std ~2
    b = leaf(g, S) if bias else None
    return values, keys, query, b, leaves + [query] + ([b] if bias else [])


def check_depth(S, B, T, d, r, view_keys, bias, normalize, atol=2e-5, rtol=1e-4):
    values, keys, query, b, leaves = depth_inputs(S, B, T, d, r, view_keys, bias)
    ref = depth_attention(values, keys, query, bias=b, normalize=normalize, return_weights=True, backend="reference")
    tri = depth_attention(values, keys, query, bias=b, normalize=normalize, return_weights=True, backend="triton")
    torch.testing.assert_close(tri.h, ref.h, atol=atol, rtol=rtol)
    torch.testing.assert_close(tri.lse, ref.lse, atol=atol, rtol=rtol)
    torch.testing.assert_close(tri.weights, ref.weights, atol=atol, rtol=rtol)
    cot_h, cot_lse = torch.randn_like(ref.h), torch.randn_like(ref.lse)
    g_ref = torch.autograd.grad((ref.h * cot_h).sum() + (ref.lse * cot_lse).sum(), leaves, retain_graph=True)
    g_tri = torch.autograd.grad((tri.h * cot_h).sum() + (tri.lse * cot_lse).sum(), leaves)
    for i, (a, b_) in enumerate(zip(g_tri, g_ref)):
        torch.testing.assert_close(a, b_, atol=atol, rtol=rtol, msg=lambda m, i=i: f"leaf {i}: {m}")
    return tri


# (S, B, T, d, r, view_keys, bias, normalize): S-LR views, P-LR separate keys, d spanning several 16-blocks, r = d
DEPTH_GRID = [
    (1, 2, 5, 8, 8, False, False, True),
    (3, 2, 7, 24, 4, True, True, True),
    (6, 1, 19, 40, 8, False, True, True),
    (4, 2, 9, 16, 16, True, False, True),
    (5, 1, 17, 33, 5, False, True, False),
    (2, 3, 6, 64, 32, True, True, True),
]


@pytest.mark.parametrize("S,B,T,d,r,view_keys,bias,normalize", DEPTH_GRID)
def test_depth_attention_triton(S, B, T, d, r, view_keys, bias, normalize):
    tri = check_depth(S, B, T, d, r, view_keys, bias, normalize)
    assert tri.h.shape == (B, T, d) and tri.lse.dtype == torch.float32


def test_depth_triton_one_source_identity_and_no_stacking(monkeypatch):
    values, keys, query, _, _ = depth_inputs(3, 2, 5, 8, 8, True, False)
    stacked = []
    monkeypatch.setattr(torch, "stack", lambda *a, **k: stacked.append(1) or torch.cat([t[None] for t in a[0]]))
    with torch.no_grad():
        h, lse = depth_triton.depth_attention_triton(values[:1], keys[:1], query)
        depth_triton.depth_attention_triton(values, keys, query)
    assert torch.equal(h, values[0]) and not stacked


@pytest.mark.slow
@pytest.mark.parametrize("S,d,r", [(13, 96, 16), (25, 128, 128), (9, 200, 24)])
def test_depth_attention_triton_slow_grid(S, d, r):
    check_depth(S, 2, 33, d, r, False, True, True)
    check_depth(S, 2, 33, d, r, True, True, True)


# ---------------------------------------------------------------- GPU only: bf16 and real sizes


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("sink_value,window", [(None, None), (0.0, None), (3.0, 128), (float("-inf"), None)])
def test_sink_attention_triton_bf16_large(sink_value, window):
    x = attention_inputs(2, 1024, 8, 2, 64, 64, sink_value, key_bias=True)
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
def test_sink_attention_triton_fp32_large():
    check_attention(attention_inputs(1, 700, 4, 2, 64, 64, 0.5, key_bias=True), window=300, atol=1e-4, rtol=1e-3)
    check_depth(20, 4, 512, 256, 32, True, True, True, atol=1e-4, rtol=1e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_depth_attention_triton_bf16():
    values, keys, query, b, _ = depth_inputs(12, 4, 256, 512, 32, True, True)
    ref = depth_attention(values, keys, query, bias=b, backend="reference")
    low = [v.detach().bfloat16() for v in values]
    tri = depth_attention(low, [v[..., -32:] for v in low], query, bias=b, backend="triton")
    torch.testing.assert_close(tri.h.float(), ref.h, atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(tri.lse, ref.lse, atol=3e-2, rtol=3e-2)
