"""attention_row_masses (probe/kernels/row_masses/): every path against the T x T reference pattern or explicit fp64
softmaxes: the CPU flash op (auto / torch on CPU), the chunked loop (windows, soft-cap), the sparse read from the
forward's real-key lse, and the Triton forward (CUDA or the interpreter). The row masses are an analysis op with no
backward (the Triton path has none), so only outputs are compared."""

import pytest
import torch

from probe.kernels import attention_row_masses, sink_attention
from probe.kernels.row_masses.chunked import row_masses_chunked
from probe.kernels.row_masses.sparse import row_masses_sparse
from probe.kernels.sink_attention.reference import attention_probs
from tests.kernels.interpreter import DEV, FRESH_PROCESS, case, rerun_in_fresh_process
from tests.kernels.naive import SINKS, inputs, naive_attention, rand_qkv, real_lse

SCALE = 8**-0.5  # the inputs' head size is 8


@pytest.mark.skipif(not FRESH_PROCESS, reason="the Triton cases run in this process")
def test_triton_in_fresh_process(request):
    rerun_in_fresh_process(request, __file__)


def masses(q, k, ind, backend, chunk=4, **kw):
    """The op on ``backend``; "chunked" is the chunked path itself, in blocks of ``chunk`` queries (block edges)."""
    with torch.no_grad():
        if backend == "chunked":
            return row_masses_chunked(q, k, ind, scale=SCALE, chunk=chunk, **kw)
        return attention_row_masses(q, k, ind, backend=backend, **kw)


def key_sets(B, T, Hkv, seed):
    """(B, T, Hkv, 3) indicators: key 0, a random key set, every key."""
    ind = torch.zeros(B, T, Hkv, 3)
    ind[:, 0, :, 0] = 1.0
    ind[:, :, :, 1] = (torch.rand(B, T, Hkv, generator=torch.Generator().manual_seed(seed)) < 0.5).float()
    ind[:, :, :, 2] = 1.0
    return ind.to(DEV)


# the torch paths on every (sink, window); Triton, interpreted at about a second a case, on a few
PATTERN_CASES = [case(b, s, w) for b in ("auto", "torch", "reference", "chunked") for s in SINKS for w in (None, 4)]
PATTERN_CASES += [case("triton", s, w) for s, w in [(None, None), (0.0, None), (float("-inf"), 4), (100.0, 4)]]
CAPPED_CASES = [case(b, s, w) for b in ("reference", "torch", "chunked") for s in (None, 0.0, 100.0) for w in (None, 3)]
CAPPED_CASES += [case("triton", s, w) for s, w in [(None, None), (0.0, None), (100.0, 3)]]


@pytest.mark.parametrize("backend,sink_value,window", PATTERN_CASES)
def test_row_masses_match_the_pattern(backend, sink_value, window):
    x = inputs(T=20, sink_value=sink_value, key_bias=sink_value in (None, 0.0), seed=1)
    kw = dict(sink=x.get("sink"), key_bias=x.get("key_bias"), window=window)
    ind = key_sets(2, 20, 2, seed=2)
    with torch.no_grad():
        ref = sink_attention(x["q"], x["k"], x["v"], return_pattern=True, backend="reference", **kw)
    lse, got = masses(x["q"], x["k"], ind, backend, **kw)
    assert got.shape == (2, 4, 20, 3) and got.dtype == torch.float32 and lse.dtype == torch.float32
    torch.testing.assert_close(lse, ref.lse, atol=1e-5, rtol=1e-5)
    want = torch.einsum("bhij,bjhc->bhic", ref.pattern, ind.repeat_interleave(2, dim=2))
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    phantom = torch.exp(x["sink"].detach()[None, :, None] - lse) if "sink" in x else torch.zeros_like(lse)
    torch.testing.assert_close(phantom, ref.phantom, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got[..., 2] + phantom, torch.ones_like(lse), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend,sink_value,window", CAPPED_CASES)
def test_softcapped_row_masses_match_naive(backend, sink_value, window):
    """Gemma 2's cap on every path (the CPU flash op cannot cap: torch takes the chunked path; Triton applies it as
    2 sigmoid(2x) - 1), with GQA, a key bias and a sink; chunks of 4 (Triton's blocks of 16) over 20 positions cross
    block edges. A cap of 1
    moves the masses by far more than the tolerance (checked), so the cap is applied, not skipped."""
    q, k, v = rand_qkv(T=20)
    q = 2 * q  # scores of several units: the cap bends them
    sink = None if sink_value is None else torch.tensor([sink_value, 0.5, -1.0, sink_value])
    key_bias = torch.randn(2, 2, 20, generator=torch.Generator().manual_seed(1))
    ind = key_sets(2, 20, 2, seed=2)[..., :2].cpu()
    kw = dict(sink=sink, key_bias=key_bias, window=window)
    _, pattern, phantom = naive_attention(q, k, v, softcap=1.0, **kw)
    on = {n: t.to(DEV) if torch.is_tensor(t) else t for n, t in kw.items()}
    lse, got = masses(q.to(DEV), k.to(DEV), ind.to(DEV), backend, softcap=1.0, **on)
    want = torch.einsum("bhij,bjhc->bhic", pattern, ind.double().repeat_interleave(2, dim=2))  # (B, H, T, 2)
    torch.testing.assert_close(got.double().cpu(), want, atol=1e-6, rtol=1e-5)
    if sink is not None:
        torch.testing.assert_close(torch.exp(sink[None, :, None] - lse.cpu()).double(), phantom, atol=1e-6, rtol=1e-5)
    _, uncapped = masses(q.to(DEV), k.to(DEV), ind.to(DEV), backend if backend != "chunked" else "torch", **on)
    assert (uncapped.double().cpu() - want).abs().max() > 0.05


@pytest.mark.parametrize("softcap", [0.0, -1.0, float("inf"), float("nan"), "2"])
def test_bad_softcap_is_refused(softcap):
    q, k, v = rand_qkv()
    with pytest.raises(ValueError, match=f"softcap must be a positive finite number or None, got {softcap!r}"):
        attention_row_masses(q, k, v, softcap=softcap)


def test_backend_and_shape_errors():
    q, k, v = rand_qkv()
    with pytest.raises(ValueError, match="backend"):
        attention_row_masses(q, k, v, backend="nope")
    with pytest.raises(ValueError, match="one sequence"):
        attention_row_masses(q[:, 1:], k, v)


# ---------------------------------------------------------------- the sparse read from the forward's real-key lse

B, T, H, HKV, DH = 2, 37, 4, 2, 8
LSE_CASES = [dict(), dict(window=5), dict(key_bias=True), dict(key_bias=True, window=5)]


def lse_inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, T, h, DH, generator=g) for h in (H, HKV))
    return q, k, 3 * torch.randn(H, generator=g), torch.randn(B, HKV, T, generator=g)


def few_keys(k, positions=(0, 5, 11)):
    """[key 0, every key, a few positions with weights]: the sink pass's and massive activations' kinds."""
    ind = torch.zeros(*k.shape[:3], 3)
    ind[:, 0, :, 0] = 1
    ind[..., 1] = 1
    ind[:, list(positions), :, 2] = torch.tensor([1.0, 0.5, 2.0])[: len(positions), None]
    return ind


@pytest.mark.parametrize("case_", range(len(LSE_CASES)))
@pytest.mark.parametrize("softcap", [None, 1.5])
def test_sparse_masses_equal_the_reference(case_, softcap):
    q, k, sink, bias = lse_inputs(10 + case_)
    kw = dict(LSE_CASES[case_])
    if kw.pop("key_bias", False):
        kw["key_bias"] = bias
    lse = real_lse(q, k, softcap=softcap, **kw).float()
    ind = few_keys(k)
    want_lse, want = attention_row_masses(q, k, ind, sink=sink, softcap=softcap, backend="reference", **kw)
    got_lse, got = attention_row_masses(q, k, ind, sink=sink, softcap=softcap, lse=lse, **kw)
    torch.testing.assert_close(got_lse, want_lse, atol=2e-6, rtol=0)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


def test_sparse_masses_stay_exact_when_the_phantom_takes_nearly_everything():
    """A sink of logit 30 leaves the real keys ~1e-11 of each row: pos0 share = mass(key 0) / mass(real) stays at fp32
    relative precision (1 - phantom would have lost every digit)."""
    q, k, _, _ = lse_inputs(20)
    sink = torch.full((H,), 30.0)
    _, got = attention_row_masses(q, k, few_keys(k), sink=sink, lse=real_lse(q, k).float())
    pattern = attention_probs(q.double(), k.double(), sink=sink.double())[0]  # (B, H, T, T) fp64
    real = pattern.sum(-1)
    assert float(real.max()) < 1e-9 and float(got[..., 1].max()) < 1e-9
    share, want_share = got[..., 0] / got[..., 1], pattern[..., 0] / real
    torch.testing.assert_close(share.double(), want_share, atol=0, rtol=1e-5)


def test_dense_columns_fall_back_and_bad_lse_shapes_are_refused():
    g = torch.Generator().manual_seed(30)
    q, k, sink = torch.randn(1, 600, H, DH, generator=g), torch.randn(1, 600, HKV, DH, generator=g), torch.randn(H)
    lse = real_lse(q, k).float()
    dense = (torch.rand(*k.shape[:3], 1, generator=g) < 0.5).float()  # half the keys: > max(64, T / 8)
    assert row_masses_sparse(q, k, dense, lse, sink=sink, scale=DH**-0.5) is None
    want = attention_row_masses(q, k, dense, sink=sink, backend="reference")[1]
    torch.testing.assert_close(attention_row_masses(q, k, dense, sink=sink, lse=lse)[1], want, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match=r"lse must be \(B, H, T\)"):
        attention_row_masses(q, k, dense, lse=lse[:, :1])


def test_fp64_inputs_with_an_fp64_sink():
    """The fp32 row-mass reference takes an fp64 model's sink and key bias (the authors' golden comparisons)."""
    g = torch.Generator().manual_seed(50)
    q, k = (torch.randn(B, T, h, DH, generator=g, dtype=torch.float64) for h in (H, HKV))
    sink, bias = 3 * torch.randn(H, generator=g, dtype=torch.float64), torch.randn(B, HKV, T, dtype=torch.float64)
    _, got = attention_row_masses(q, k, few_keys(k).double(), sink=sink, key_bias=bias, backend="reference")
    pattern = attention_probs(q, k, sink=sink, key_bias=bias)[0]
    torch.testing.assert_close(got[..., 1].double(), pattern.sum(-1), atol=1e-6, rtol=0)


@pytest.mark.parametrize("backend", [case("triton")])
@pytest.mark.parametrize("sink_value,window", [(None, None), (0.7, None), (100.0, 6)])
def test_triton_forward_lse_feeds_the_sparse_row_masses(backend, sink_value, window):
    """return_lse on the Triton path: the kernel's own lse without a phantom, else the row-mass op's (Triton) real
    mass; the masses read from it equal the Triton row masses (docs/definitions.md#row-log-normaliser)."""
    x = inputs(2, 20, 4, 2, 8, 8, sink_value=sink_value, key_bias=True)
    ind = torch.zeros(2, 20, 2, 2, device=DEV)
    ind[:, 0, :, 0] = 1.0
    ind[:, :, :, 1] = 1.0
    kw = dict(sink=x.get("sink"), key_bias=x["key_bias"], window=window)
    with torch.no_grad():
        ref = sink_attention(x["q"], x["k"], x["v"], return_pattern=True, backend="reference", **kw)
        res = sink_attention(x["q"], x["k"], x["v"], return_lse=True, backend=backend, **kw)
        want = attention_row_masses(x["q"], x["k"], ind, backend=backend, **kw)[1]
        got = attention_row_masses(x["q"], x["k"], ind, lse=res.lse_real, backend=backend, **kw)[1]
    real = torch.log(ref.pattern.sum(-1)) + ref.lse  # the real keys' lse from the fp32 reference
    torch.testing.assert_close(res.lse_real, real, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
