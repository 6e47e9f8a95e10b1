"""No T x T tensor on HF checkpoints (docs/definitions.md#long-context): the adapters hand the kernels causal and
sliding-window rules instead of transformers' dense B x 1 x T x T mask, so a streaming analysis allocates nothing of
T x T, on tiny Gemma 2/3, llama, gpt-oss and Mistral configs whose sliding window (4) is far shorter than T; and what
they compute equals the dense-mask / pattern paths."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM

import probe
from probe.analyses.inject import exposure_stats
from probe.analyses.sink_heads import sink_heads
from probe.analyses.sink_pass import sink_analyses
from probe.analyses.sinks import sink_stats_reference
from probe.checkpoints import attention as A
from probe.checkpoints.tiny import build_tiny

FAMILIES = ("gemma2", "gemma3_text", "llama", "gpt_oss", "mistral")
# longer than the row-mass kernels' query chunk (256) and than every width of the tiny configs (vocabulary 96), so a
# tensor with two axes >= T can only be query x key
T = 320
BLOCK = 64  # the adapters' query block here (at least the window; default 256)


class NoSquare(TorchDispatchMode):
    """Raise on any op that returns a tensor with two axes of at least ``length`` (a Tq x Tk score, mask or pattern),
    whatever allocated it: transformers' mask builders, the reference attention, a kernel's torch path."""

    def __init__(self, length: int):
        super().__init__()
        self.length = length

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and sum(s >= self.length for s in t.shape) >= 2:
                raise AssertionError(f"{func} made a {tuple(t.shape)} tensor (T = {self.length})")
        return out


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """family -> (adapted model via probe.load, the same weights in HF with eager attention: the dense-mask path).
    The tiny configs' 128 positions are raised to cover T (the adapters refuse a sequence past
    max_position_embeddings; rotary positions are computed, so the weights are the same)."""
    root = tmp_path_factory.mktemp("long_context")
    out = {}
    for fam in FAMILIES:
        d = build_tiny(fam, root / fam)
        config = json.loads((d / "config.json").read_text())
        config["max_position_embeddings"] = max(config["max_position_embeddings"], 4 * T)
        (d / "config.json").write_text(json.dumps(config))
        ref = AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager", dtype=torch.float32).eval()
        out[fam] = (probe.load(str(d)), ref)
    return out


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(A, "MIN_BLOCK", BLOCK)
    monkeypatch.setattr(A, "PADDED_BLOCK_ELEMENTS", 2 * BLOCK * T)


def windows(n=1, batch=1, seed=0):
    return torch.randint(2, 96, (n, batch, T + 1), generator=torch.Generator().manual_seed(seed))


def numbers(df):
    return torch.tensor(df.select_dtypes("number").to_numpy(float))


def test_the_guard_catches_a_dense_mask():
    """The check itself: transformers' eager mask (what the adapters registered before) is caught."""
    from transformers.masking_utils import eager_mask

    with pytest.raises(AssertionError, match="made a"), NoSquare(T):
        eager_mask(batch_size=1, q_length=T, kv_length=T)


@pytest.mark.parametrize("fam", FAMILIES)
@torch.no_grad()
def test_streaming_analyses_allocate_nothing_t_by_t(models, fam, small_blocks):
    m, _ = models[fam]
    w = windows()
    with NoSquare(T):
        found = sink_analyses(m, w, eps=[0.3], massive=True)
        exposure_stats(m, w)
        m(w[0, :, :-1], return_hidden=True)  # a plain forward of the decoder
    assert {"sinks", "sink_eps", "massive"} <= set(found)


@pytest.mark.parametrize("fam", FAMILIES)
@torch.no_grad()
def test_streaming_results_equal_the_pattern_path(models, fam, small_blocks):
    """Sink statistics and Sink^ε from the rule-masked forward and row masses equal those from materialised patterns
    (whose forward fires hook_pattern: the T x T path) to 1e-6."""
    m, _ = models[fam]
    w = windows(n=1, batch=2, seed=1)
    found = sink_analyses(m, w, eps=[0.3])
    ref = sink_stats_reference(m, w)
    for table in ("layers", "heads"):
        torch.testing.assert_close(
            numbers(found["sinks"][table]), numbers(ref[table]), atol=1e-6, rtol=0, equal_nan=True
        )
    pat = sink_heads(m, w, eps=[0.3], method="pattern")
    torch.testing.assert_close(
        numbers(found["sink_eps"]["heads"]), numbers(pat["heads"]), atol=1e-6, rtol=0, equal_nan=True
    )


@pytest.mark.parametrize("fam", FAMILIES)
@torch.no_grad()
def test_rule_masks_equal_hf_dense_masks_with_and_without_padding(models, fam, small_blocks):
    """The adapter's forward (rules; query blocks; padded keys in blocks) equals HF eager's dense mask to 1e-5 in the
    logits, with left padding too, and makes no T x T tensor on the way."""
    m, ref = models[fam]
    x = windows(batch=2, seed=2)[0, :, :-1]
    keep = torch.ones(2, T, dtype=torch.long)
    keep[1, :7] = 0  # left padding in the second row
    for mask in (None, keep):
        want = ref(x, attention_mask=mask).logits[:, -8:]
        with NoSquare(T):
            hidden = m(x, attention_mask=mask, return_hidden=True)[:, -8:]
        torch.testing.assert_close(m.unembed(hidden), want, atol=1e-5, rtol=0)


def test_rules_mask_keeps_the_dense_mask_where_the_rule_cannot_say_it():
    """A cache offset, or a mask function that is not causal / the window (a chunked or bidirectional overlay),
    gets transformers' dense eager mask; causal and sliding ones get rules."""
    from transformers.masking_utils import (
        causal_mask_function,
        chunked_causal_mask_function,
        sliding_window_causal_mask_function,
    )

    n = 12
    assert A.rules_mask(1, n, n, mask_function=causal_mask_function) == A.MaskRules(None)
    assert A.rules_mask(1, n, n, mask_function=sliding_window_causal_mask_function(4), local_size=4) == A.MaskRules(4)
    chunked = A.rules_mask(
        1, n, n, mask_function=chunked_causal_mask_function(4, torch.zeros(1, dtype=torch.long)), local_size=4
    )
    assert isinstance(chunked, torch.Tensor) and chunked.shape == (1, 1, n, n)
    cached = A.rules_mask(1, 1, n, q_offset=n - 1, mask_function=causal_mask_function)
    assert isinstance(cached, torch.Tensor) and cached.shape == (1, 1, 1, n)
    overlay = A.rules_mask(1, n, n, mask_function=causal_mask_function, allow_is_causal_skip=False)
    assert isinstance(overlay, torch.Tensor)
    padded = A.rules_mask(
        2,
        n,
        n,
        mask_function=causal_mask_function,
        attention_mask=torch.tensor([[True] * n, [False] * 3 + [True] * (n - 3)]),
    )
    assert padded.window is None and padded.keep.shape == (2, n) and not padded.keep[1, :3].any()


@pytest.mark.parametrize("fam", ["gemma3_text", "gpt_oss"])
@torch.no_grad()
def test_generation_with_a_cache_equals_hf_eager(models, fam):
    """With a KV cache the prefill gets rules and each decoding step (a cache offset) transformers' dense 1 x Tk mask:
    greedy tokens past the sliding window equal HF eager's."""
    m, ref = models[fam]
    x = windows(seed=3)[0, :, :12]
    kw = dict(max_new_tokens=8, do_sample=False, pad_token_id=1)
    torch.testing.assert_close(m.hf_model.generate(x, **kw), ref.generate(x, **kw), atol=0, rtol=0)


@pytest.mark.parametrize("fam", FAMILIES)
@torch.no_grad()
def test_the_sink_pass_reads_the_forwards_lse_instead_of_recomputing_scores(models, fam, small_blocks, monkeypatch):
    """Sink statistics, Sink^ε and massive activations mark key 0, a few positions or every key: with ``hook_lse``
    their masses cost O(T) per row (docs/definitions.md#row-log-normaliser). Every full recomputation of a layer's
    scores (the row-mass op's torch paths) is counted: none where the fused forward has the real-key lse (no phantom,
    or gpt-oss's causal phantom fold), one per sliding layer for gpt-oss, whose windowed phantom sits inside the
    kernel (one call of the op per layer, whose windowed path runs its own query blocks); and the numbers equal those
    of the recomputing path."""
    from probe.kernels.row_masses import dispatch
    from probe.kernels.sink_attention import dispatch as sink_dispatch

    m, _ = models[fam]
    w = windows(n=1, batch=2, seed=4)
    calls = []
    for module, name in [
        (dispatch, "row_masses_flash_cpu"),
        (dispatch, "row_masses_chunked"),
        (dispatch, "row_masses_reference"),
        (sink_dispatch, "real_lse_blocked"),
    ]:
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
    found = sink_analyses(m, w, eps=[0.3], massive=True)
    info = m.probe_info
    sliding = sum(t == "sliding" for t in info.layer_types)
    assert len(calls) == (sliding if info.has_phantom else 0), calls
    monkeypatch.setattr(dispatch, "row_masses_sparse", lambda *a, **k: None)  # every layer recomputes its scores
    again = sink_analyses(m, w, eps=[0.3], massive=True)
    for analysis, table in [("sinks", "heads"), ("sink_eps", "heads"), ("massive", "layers")]:
        torch.testing.assert_close(
            numbers(found[analysis][table]), numbers(again[analysis][table]), atol=1e-6, rtol=0, equal_nan=True
        )
