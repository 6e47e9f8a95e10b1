"""Each row's log-normaliser over the real keys (``return_lse`` / ``hook_lse``, docs/definitions.md#row-log-normaliser)
on every torch path, and the sparse row masses read from it (``attention_row_masses(..., lse=)``), against the fp64
reference: the phantom stays out of the lse, so a head whose phantom takes nearly everything stays well conditioned."""

import pytest
import torch

from probe.kernels import attention_row_masses, sink_attention
from probe.kernels.row_masses.sparse import row_masses_sparse
from probe.kernels.sink_attention import edits
from probe.kernels.sink_attention.dispatch import real_lse as fallback_real_lse
from probe.kernels.sink_attention.reference import attention_probs, real_lse_blocked, visible_mask

B, T, H, HKV, DH = 2, 37, 4, 2, 8


def inputs(seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, T, h, DH, generator=g, dtype=dtype) for h in (H, HKV, HKV))
    return q, k, v, 3 * torch.randn(H, generator=g, dtype=dtype), torch.randn(B, HKV, T, generator=g, dtype=dtype)


def real_lse(q, k, **kw):
    """fp64 log Σ_visible exp(score), no phantom: attention_probs without a sink."""
    return attention_probs(
        q.double(), k.double(), **{a: (b.double() if torch.is_tensor(b) else b) for a, b in kw.items()}
    )[2]


CASES = [
    dict(),
    dict(window=5),
    dict(key_bias=True),
    dict(key_bias=True, window=5),
]


@pytest.mark.parametrize("backend", ["sdpa", "reference", "auto"])
@pytest.mark.parametrize("with_sink", [False, True])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_lse_real_is_the_real_keys_lse_on_every_path(backend, with_sink, case):
    q, k, v, sink, bias = inputs(case)
    kw = dict(CASES[case])
    if kw.pop("key_bias", False):
        kw["key_bias"] = bias
    res = sink_attention(q, k, v, sink=sink if with_sink else None, return_lse=True, backend=backend, **kw)
    torch.testing.assert_close(res.lse_real.double(), real_lse(q, k, **kw), atol=2e-6, rtol=0)


def test_lse_real_under_autograd_with_a_mask_and_with_a_cache():
    q, k, v, sink, _ = inputs(1)
    q.requires_grad_(True)
    res = sink_attention(q, k, v, sink=sink, return_lse=True)  # recording: the fused op gives no lse
    torch.testing.assert_close(res.lse_real.double(), real_lse(q.detach(), k), atol=2e-6, rtol=0)
    allowed = visible_mask(T, 6, Tk=T)[None, None].repeat(B, 1, 1, 1)
    allowed[1, :, :, :3] = False
    allowed[1, :, :3, 0] = True
    mask = torch.zeros(B, 1, T, T).masked_fill(~allowed, torch.finfo(torch.float32).min)
    with torch.no_grad():
        got = sink_attention(q, k, v, sink=sink, mask=mask, return_lse=True).lse_real
    torch.testing.assert_close(got.double(), real_lse(q.detach(), k, mask=mask), atol=2e-6, rtol=0)
    with torch.no_grad():  # the last 5 queries over all keys (a cache)
        got = sink_attention(q[:, -5:], k, v, sink=sink, window=6, return_lse=True).lse_real
    torch.testing.assert_close(got.double(), real_lse(q.detach()[:, -5:], k, window=6), atol=2e-6, rtol=0)


def test_blocked_lse_equals_the_whole_one_with_broadcast_masks():
    q, k, _, _, bias = inputs(2, torch.float64)
    mask = torch.zeros(B, 1, 1, T, dtype=torch.float64)
    mask[1, ..., :4] = float("-inf")  # key padding broadcast over queries (rows 0-3 of sequence 1 see nothing)
    for kw in (dict(window=4, keep=2), dict(key_bias=bias, mask=mask), dict(softcap=2.0)):
        whole = attention_probs(q, k, **kw)[2]
        torch.testing.assert_close(real_lse_blocked(q, k, block=8, **kw), whole, atol=1e-12, rtol=0)


@pytest.mark.parametrize("with_sink", [False, True])
def test_lse_real_of_an_edited_call_is_the_edited_attentions(with_sink):
    """Under an armed key-0 knockout the lse excludes key 0 (without a phantom query 0 keeps its clean row; with one
    it sees no real key: -inf); under an eviction it is over the kept first keys and the window."""
    q, k, v, sink, _ = inputs(3)
    sink = sink if with_sink else None
    for edit, visible in [
        (edits.AttentionEdit(knockout=True), visible_mask(T, None) & (torch.arange(T)[None, :] > 0)),
        (edits.AttentionEdit(keep=2, window=4), visible_mask(T, 4, keep=2)),
    ]:
        with edits.armed():
            edits.arm(edit)
            got = sink_attention(q, k, v, sink=sink, return_lse=True).lse_real
        mask = torch.zeros(T, T, dtype=torch.float64).masked_fill(~visible, float("-inf"))
        want = real_lse(q, k, mask=mask)
        if edit.knockout and sink is None:
            want[:, :, 0] = real_lse(q[:, :1], k[:, :1])[:, :, 0]
        torch.testing.assert_close(got.double(), want, atol=2e-6, rtol=0)


def indicators(k, positions=(0, 5, 11)):
    """[key 0, every key, a few positions with weights]: the sink pass's and massive activations' kinds."""
    ind = torch.zeros(*k.shape[:3], 3)
    ind[:, 0, :, 0] = 1
    ind[..., 1] = 1
    ind[:, list(positions), :, 2] = torch.tensor([1.0, 0.5, 2.0])[: len(positions), None]
    return ind


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("softcap", [None, 1.5])
def test_sparse_masses_equal_the_reference(case, softcap):
    q, k, _, sink, bias = inputs(10 + case)
    kw = dict(CASES[case])
    if kw.pop("key_bias", False):
        kw["key_bias"] = bias
    lse = real_lse(q, k, softcap=softcap, **kw).float()
    ind = indicators(k)
    want_lse, want = attention_row_masses(q, k, ind, sink=sink, softcap=softcap, backend="reference", **kw)
    got_lse, got = attention_row_masses(q, k, ind, sink=sink, softcap=softcap, lse=lse, **kw)
    torch.testing.assert_close(got_lse, want_lse, atol=2e-6, rtol=0)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


def test_sparse_masses_stay_exact_when_the_phantom_takes_nearly_everything():
    """A sink of logit 30 leaves the real keys ~1e-11 of each row: pos0 share = mass(key 0) / mass(real) stays at fp32
    relative precision (1 - phantom would have lost every digit)."""
    q, k, _, _, _ = inputs(20)
    sink = torch.full((H,), 30.0)
    lse = real_lse(q, k)
    _, got = attention_row_masses(q, k, indicators(k), sink=sink, lse=lse.float())
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


def test_the_fallback_lse_is_well_conditioned():
    """Where the fused op had the phantom among its keys, the real lse is log(real mass) + L, the real mass summed by
    the row-mass op: exact even when the phantom takes all but 1e-11 of each row."""
    q, k, _, _, bias = inputs(40)
    sink = torch.full((H,), 30.0)
    got = fallback_real_lse(q, k, sink, bias, None, 5, DH**-0.5, None, "auto")
    torch.testing.assert_close(got.double(), real_lse(q, k, key_bias=bias, window=5), atol=2e-5, rtol=0)


@pytest.mark.parametrize("backend", ["reference", "auto"])
def test_lse_real_of_fp64_inputs_is_fp64(backend):
    """An fp64 model (the authors' golden comparisons) with a phantom: the fallback keeps fp64, and the fp32 row-mass
    reference takes an fp64 sink."""
    q, k, v, sink, bias = inputs(50, torch.float64)
    res = sink_attention(q, k, v, sink=sink, key_bias=bias, return_lse=True, backend=backend)
    assert res.lse_real.dtype == torch.float64
    torch.testing.assert_close(res.lse_real, real_lse(q, k, key_bias=bias), atol=1e-12, rtol=0)
    ind = indicators(k).double()
    _, got = attention_row_masses(q, k, ind, sink=sink, key_bias=bias, backend="reference")
    pattern = attention_probs(q, k, sink=sink, key_bias=bias)[0]
    torch.testing.assert_close(got[..., 1].double(), pattern.sum(-1), atol=1e-6, rtol=0)
