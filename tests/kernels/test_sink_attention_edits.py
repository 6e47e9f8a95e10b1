"""Attention edits carried out by the op (probe.kernels.sink_attention.edits): key-0 knockout through the per-key bias
and window eviction through the kept-first-keys rule, on every backend (Triton on CUDA or the interpreter, in fp32;
the torch paths in fp64), against explicit softmaxes. Edits are analysis-time: outputs only."""

import pytest
import torch

from probe.kernels import sink_attention
from probe.kernels.sink_attention import dispatch as sink_dispatch
from probe.kernels.sink_attention import edits, reference
from probe.kernels.sink_attention.reference import visible_mask
from tests.kernels.interpreter import DEV, FRESH_PROCESS, case, rerun_in_fresh_process

B, T, H, HKV, DH = 2, 13, 4, 2, 8
BACKENDS = ["reference", "sdpa", "triton"]
TOLERANCE = {"reference": (1e-7, 1e-6), "sdpa": (1e-7, 1e-6), "triton": (2e-6, 1e-5)}  # fp64 / fp32 inputs


@pytest.mark.skipif(not FRESH_PROCESS, reason="the Triton cases run in this process")
def test_triton_in_fresh_process(request):
    rerun_in_fresh_process(request, __file__)


def inputs(seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, T, h, DH, generator=g, dtype=dtype) for h in (H, HKV, HKV)]


def on(backend, *tensors):
    """The tensors as ``backend`` takes them: Triton's in fp32 on DEV (it has no fp64 kernel), the others as given."""
    return [t.float().to(DEV) if backend == "triton" else t for t in tensors]


def naive(q, k, v, visible, sink=None):
    """Explicit softmax over the visible keys (Tq, Tk) bool and the phantom (value 0); empty rows give 0."""
    G = H // HKV
    s = torch.einsum("bihd,bjhd->bhij", q, k.repeat_interleave(G, 2)) / DH**0.5
    s = s.masked_fill(~visible, float("-inf"))
    if sink is not None:
        s = torch.cat([sink[None, :, None, None].expand(B, H, T, 1).to(s.dtype), s], -1)
    a = torch.softmax(s, -1).nan_to_num(0.0)
    a = a[..., 1:] if sink is not None else a
    return torch.einsum("bhij,bjhd->bihd", a, v.repeat_interleave(G, 2))


def edited(edit, *args, **kw):
    return sink_attention(*args, edit=edit, **kw)


def test_visible_mask_keeps_the_first_keys():
    for w, keep in [(1, 0), (3, 1), (3, 4), (5, 20)]:
        m = visible_mask(T, w, keep=keep)
        for i in range(T):
            for j in range(T):
                assert bool(m[i, j]) == (j <= i and (j > i - w or j < keep)), (w, keep, i, j)


@pytest.mark.parametrize("backend,with_sink", [case(b, s) for b in BACKENDS for s in (False, True)])
def test_knockout_removes_key_0_and_query_0_keeps_its_clean_row(backend, with_sink):
    q, k, v = inputs()
    sink = torch.tensor([0.5, float("-inf"), -1.0, 2.0], dtype=torch.float64) if with_sink else None
    args = on(backend, q, k, v) + [None if sink is None else on(backend, sink)[0]]
    out = edited(edits.AttentionEdit(knockout=True), *args[:3], sink=args[3], backend=backend).out
    if backend == "triton":  # the explicit softmax of the inputs Triton saw
        q, k, v = (x.double().cpu() for x in args[:3])
    causal = visible_mask(T, None)
    knocked = causal.clone()
    knocked[:, 0] = False
    want = naive(q, k, v, knocked, sink)
    clean = naive(q, k, v, causal, sink)
    empty = torch.ones(H, dtype=torch.bool) if sink is None else torch.isneginf(sink)  # no phantom: query 0 is empty
    want[:, 0] = torch.where(empty[None, :, None], clean[:, 0], want[:, 0])
    atol, rtol = TOLERANCE[backend]
    torch.testing.assert_close(out.double().cpu(), want, atol=atol, rtol=rtol)


def test_knockout_of_chosen_kv_heads_only():
    q, k, v = inputs()
    out = edited(edits.AttentionEdit(knockout=True, kv_heads=(1,)), q, k, v, backend="reference").out
    clean = sink_attention(q, k, v, backend="reference").out
    full = edited(edits.AttentionEdit(knockout=True), q, k, v, backend="reference").out
    torch.testing.assert_close(out[:, :, :2], clean[:, :, :2], atol=0, rtol=0)  # query heads 0, 1 read KV head 0
    torch.testing.assert_close(out[:, :, 2:], full[:, :, 2:], atol=1e-12, rtol=0)  # bias vs one key fewer


@pytest.mark.parametrize(
    "backend,keep,window", [case(b, *c) for b in BACKENDS for c in [(0, 3), (1, 3), (4, 2), (2, 1)]]
)
def test_eviction_is_masked_attention_at_original_positions(backend, keep, window):
    q, k, v, sink = on(backend, *inputs(), torch.tensor([0.5, -1.0, 0.0, 2.0], dtype=torch.float64))
    out = edited(edits.AttentionEdit(keep=keep, window=window), q, k, v, sink=sink, backend=backend).out
    q, k, v, sink = (x.double().cpu() for x in (q, k, v, sink))
    want = naive(q, k, v, visible_mask(T, window, keep=keep), sink)
    atol, rtol = TOLERANCE[backend]
    torch.testing.assert_close(out.double().cpu(), want, atol=atol, rtol=rtol)


@pytest.mark.parametrize("keep,window", [(0, T), (3, T - 3), (T, 1)])
def test_eviction_with_keep_plus_window_covering_the_sequence_is_clean_exactly(keep, window):
    q, k, v = (x.float() for x in inputs())
    clean = sink_attention(q, k, v, backend="sdpa").out
    out = edited(edits.AttentionEdit(keep=keep, window=window), q, k, v, backend="sdpa").out
    assert torch.equal(visible_mask(T, window, keep=keep), visible_mask(T, None))
    torch.testing.assert_close(out, clean, atol=1e-6, rtol=1e-5)


def test_the_layers_own_tighter_window_wins():
    q, k, v = inputs()
    own = sink_attention(q, k, v, window=2, backend="reference").out
    out = edited(edits.AttentionEdit(keep=4, window=5), q, k, v, window=2, backend="reference").out
    assert torch.equal(out, own)  # the layer's window (2) is tighter: kept keys outside it stay unseen
    both = visible_mask(T, 3, keep=2) & visible_mask(T, 8)  # the eviction's window is tighter, the layer's < T
    out = edited(edits.AttentionEdit(keep=2, window=3), q, k, v, window=8, backend="reference").out
    torch.testing.assert_close(out, naive(q, k, v, both), atol=1e-7, rtol=1e-6)


def test_an_additive_mask_takes_the_eviction_rule():
    """HF adapters pass their own additive mask: the rule joins it (same output as the native rule)."""
    q, k, v = inputs()
    mask = torch.zeros(T, T, dtype=torch.float64).masked_fill(~visible_mask(T, None), float("-inf"))[None, None]
    via_mask = edited(edits.AttentionEdit(keep=2, window=3, knockout=True), q, k, v, mask=mask, backend="sdpa").out
    native = edited(edits.AttentionEdit(keep=2, window=3, knockout=True), q, k, v, backend="reference").out
    torch.testing.assert_close(via_mask, native, atol=1e-7, rtol=1e-6)


def test_edits_build_no_t_by_t_pattern(monkeypatch):
    """On the runtime (auto) backend neither edit reaches the T x T reference op."""

    def refuse(*a, **k):
        raise AssertionError("the T x T reference op ran")

    monkeypatch.setattr(reference, "attention_probs", refuse)
    monkeypatch.setattr(sink_dispatch, "sink_attention_reference", refuse)
    q, k, v = (x.float() for x in inputs())
    for edit in (edits.AttentionEdit(knockout=True), edits.AttentionEdit(keep=2, window=4)):
        out = edited(edit, q, k, v).out
        assert torch.isfinite(out).all()


def test_an_untaken_or_doubly_handed_edit_is_an_error():
    layer = torch.nn.Module()
    layer.hook_v_out = torch.nn.Identity()
    edits.carry(layer.hook_v_out, edits.AttentionEdit(knockout=True))
    with pytest.raises(RuntimeError, match="twice"):
        edits.carry(layer.hook_v_out, edits.AttentionEdit(knockout=True))
    with pytest.raises(RuntimeError, match="no probe.kernels.sink_attention call took it"):
        with edits.carried(layer):
            pass
    assert edits.taken(layer.hook_v_out) is None  # the scope removed the untaken edit
    edits.carry(layer.hook_v_out, edits.AttentionEdit(knockout=True))
    with edits.carried(layer):
        assert edits.taken(layer.hook_v_out).knockout  # taken by the layer: nothing left
    with pytest.raises(ValueError, match="both keep and window"):
        edits.AttentionEdit(keep=2)
    with pytest.raises(ValueError, match="keep"):
        sink_attention(*inputs(), keep=2)  # the rule needs a window
