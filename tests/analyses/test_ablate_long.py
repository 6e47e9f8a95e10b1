"""Ablations at stream length on HF checkpoints (docs/definitions.md#window-eviction, docs/definitions.md#long-context):
an attention edit acts on every query of a layer, also where the kernels' windowed path splits the queries into blocks.

Tiny gemma3_text (sliding and full layers), Mistral (a window in every layer), llama (full layers) and gpt-oss (a
phantom on sliding and full layers) configs with a sliding window of 4 keys, T = 300 queries and query blocks of 64:
knockout and eviction through ``ablation_hooks`` equal the same weights in transformers with a dense, explicit
attention function of the same rule on **every** row's logits; nothing T x T is allocated on the way; memory grows
linearly in T.
"""

from __future__ import annotations

import inspect
import json
import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AttentionInterface, AutoModelForCausalLM

import probe
from probe.analyses.ablate import Ablation, Eviction, Knockout, ablation_hooks
from probe.checkpoints.tiny import build_tiny
from probe.kernels.sink_attention import edits, sdpa

FAMILIES = ("gemma3_text", "mistral", "llama", "gpt_oss")
T = 300
BLOCK = 64  # the kernels' query block here (default 256): five blocks of queries per layer
DENSE = "probe_test_dense_rule"
RULE: dict = {}  # the rule the dense attention function applies (set by each case)
TABLES: dict = {}  # cache positions: layer -> transformers' own (cos, sin) (T, dh) at positions 0 .. T-1


def cache_positions(i, j, keep: int, window: int):
    """(query position (T, 1), key positions (T, T)) within each query's cache: kept key j < keep outside the window
    at j, window keys after them (the query at min(t, keep + window - 1))."""
    p = i.clamp(max=keep + window - 1)
    kept = (j < keep) & (j <= i - window)
    return p, torch.where(kept, j, j - i + p)


def reencoded_scores(q, k, layer: int, keep: int, window: int):
    """Scores of each query against every key re-encoded at its position in that query's cache: q and k un-rotated
    from their positions in the text and rotated again at the cache's, with transformers' own tables and
    rotate_half (fp64). q (B,H,T,dh), k (B,H,T,dh) -> (B,H,T,T)."""
    from transformers.models.llama.modeling_llama import rotate_half

    cos, sin = (t.double() for t in TABLES[layer])  # (T, dh)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    p, c = cache_positions(i, j, keep, window)
    raw_q = q.double() * cos - rotate_half(q.double()) * sin  # rotated back to position 0
    raw_k = k.double() * cos - rotate_half(k.double()) * sin
    q_c = raw_q * cos[p[:, 0]] + rotate_half(raw_q) * sin[p[:, 0]]  # (B, H, T, dh) at the cache's query position
    k_c = raw_k[:, :, None] * cos[c] + rotate_half(raw_k)[:, :, None] * sin[c]  # (B, H, T, T, dh): key j for query t
    return torch.einsum("bhtd,bhtjd->bhtj", q_c, k_c)


def dense_rule_attention(module, q, k, v, mask, scaling=None, dropout=0.0, sliding_window=None, s_aux=None, **kw):
    """Explicit fp64 softmax over the keys the case's rule leaves visible (every row T x T), with the layer's own
    window and, for gpt-oss, its learned sink column (value 0)."""
    n = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(n, 1), v.double().repeat_interleave(n, 1)
    s = (q.double() @ k.transpose(-1, -2)) * scaling  # (B, H, T, T)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    seen = j <= i
    distance = i - j
    if RULE.get("positions") == "cache":
        s = reencoded_scores(q, k, module.layer_idx, RULE["keep"], RULE["window"]) * scaling
        p, c = cache_positions(i, j, RULE["keep"], RULE["window"])
        distance = p - c  # the layer's own window counts the distance within the cache
    if sliding_window is not None:
        seen &= distance < sliding_window
    if RULE.get("window") is not None:
        seen &= (j > i - RULE["window"]) | (j < RULE["keep"])
    if RULE.get("knockout"):
        seen &= (j > 0) | (i == 0) if s_aux is None else j > 0  # no phantom: query 0 keeps its clean row
    s = s.masked_fill(~seen, float("-inf"))
    if s_aux is not None:
        s = torch.cat([s_aux.double()[None, :, None, None].expand(*s.shape[:3], 1), s], -1)
    a = torch.softmax(s, -1)
    a = a[..., 1:] if s_aux is not None else a
    return (a @ v).to(q.dtype).transpose(1, 2).contiguous(), None


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """family -> (probe.load of a tiny checkpoint, the same weights in transformers with the dense rule attention).
    The tiny configs' 128 positions are raised to cover the longest stream here (2048): the adapters refuse a
    sequence past max_position_embeddings; rotary positions are computed, so the weights are the same."""
    AttentionInterface.register(DENSE, dense_rule_attention)
    root = tmp_path_factory.mktemp("ablate_long")
    out = {}
    for fam in FAMILIES:
        d = build_tiny(fam, root / fam)
        config = json.loads((d / "config.json").read_text())
        config["max_position_embeddings"] = max(config["max_position_embeddings"], 2048)
        (d / "config.json").write_text(json.dumps(config))
        ref = AutoModelForCausalLM.from_pretrained(d, attn_implementation=DENSE, dtype=torch.float32).eval()
        out[fam] = (probe.load(str(d)), ref)
    return out


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(sdpa, "QUERY_BLOCK", BLOCK)


def tokens(batch=1, length=T, seed=0):
    return torch.randint(2, 96, (batch, length), generator=torch.Generator().manual_seed(seed))


def logits(out):
    return out if isinstance(out, torch.Tensor) else out.logits


def ablated_logits(model, x, abl):
    with torch.no_grad(), edits.carried(model):
        return logits(model.run_with_hooks(x, fwd_hooks=ablation_hooks(model, abl)))


CASES = [  # (intervention, the dense rule)
    (Eviction(keep=1, window=2), dict(keep=1, window=2)),  # the eviction's window inside the layers' own (4)
    (Eviction(keep=2, window=40), dict(keep=2, window=40)),  # the layers' own window is the tighter on sliding layers
    (Eviction(keep=0, window=3), dict(keep=0, window=3)),
    (Eviction(keep=4, window=150), dict(keep=4, window=150)),  # a window spanning several query blocks
    (Knockout(), dict(knockout=True)),
]


@pytest.mark.parametrize("fam", FAMILIES)
@pytest.mark.parametrize("case", range(len(CASES)), ids=[f"{c[0].name}-{c[0].label}" for c in CASES])
def test_every_query_block_takes_the_edit(models, fam, case, small_blocks):
    """Every row of the ablated logits equals the dense rule's (1e-4), past the first query block as before it."""
    m, ref = models[fam]
    edit, rule = CASES[case]
    x = tokens(seed=case)
    RULE.clear()
    RULE.update(rule)
    with torch.no_grad():
        want = ref(x).logits
    got = ablated_logits(m, x, Ablation(edit))
    err = (got - want).abs().amax(-1)[0]  # per row
    assert err.max() < 1e-4, f"rows with error > 1e-4: {torch.nonzero(err > 1e-4).flatten()[:8].tolist()}"
    RULE.clear()
    with torch.no_grad():
        clean = ref(x).logits
    no_op = fam == "mistral" and rule.get("window", 0) >= 4  # every layer's own window (4) is the tighter
    assert ((want - clean).abs().amax() > 1e-3) != no_op  # else the comparison would be clean vs clean


ROTARY = (
    "gemma3_text",
    "mistral",
    "llama",
)  # rotary on every coordinate, no attention scaling: HF's tables as they are


def hf_tables(ref, x):
    """Layer -> transformers' own rotary (cos, sin) (T, dh) at positions 0 .. T-1 of the reference model."""
    base, types = ref.model, getattr(ref.config, "layer_types", None)
    positions = torch.arange(T)[None]
    out = {}
    for l in range(ref.config.num_hidden_layers):
        args = (types[l],) if "layer_type" in inspect.signature(base.rotary_emb.forward).parameters else ()
        cos, sin = base.rotary_emb(x.float(), positions, *args)
        out[l] = (cos[0], sin[0])
    return out


@pytest.mark.parametrize("fam", ROTARY)
@pytest.mark.parametrize("keep,window", [(1, 2), (4, 3), (2, 40), (4, 150), (0, 5)])
def test_cache_positions_equal_each_querys_cache_reencoded(models, fam, keep, window, small_blocks):
    """Eviction at positions within the cache equals, on every row, attention whose keys are each query's cache
    re-encoded explicitly (un-rotated from the text's positions and rotated at the cache's, transformers' own
    rotary), the layers' own windows counting distances within the cache."""
    m, ref = models[fam]
    x = tokens(seed=keep + window)
    TABLES.clear()
    TABLES.update(hf_tables(ref, x))
    RULE.clear()
    RULE.update(keep=keep, window=window, positions="cache")
    with torch.no_grad():
        want = ref(x).logits
    got = ablated_logits(m, x, Ablation(Eviction(keep, window, positions="cache")))
    err = (got - want).abs().amax(-1)[0]
    assert err.max() < 1e-4, f"rows with error > 1e-4: {torch.nonzero(err > 1e-4).flatten()[:8].tolist()}"
    if keep and not (fam == "mistral" and window >= 4):  # kept keys seen: their positions matter
        original = ablated_logits(m, x, Ablation(Eviction(keep, window)))
        assert (original - got).abs().amax() > 1e-5


@pytest.mark.parametrize("fam", ["gemma3_text", "llama"])
def test_eviction_with_k_plus_w_covering_the_stream_is_the_clean_forward(models, fam, small_blocks):
    m, _ = models[fam]
    x = tokens(seed=7)
    with torch.no_grad():
        clean = logits(m(x))
    for keep, window, positions in (
        (0, T, "original"),
        (4, T - 4, "original"),
        (T, 1, "original"),
        (4, T - 4, "cache"),
        (0, T, "cache"),
    ):
        edit = Eviction(keep, window, positions)
        torch.testing.assert_close(ablated_logits(m, x, Ablation(edit)), clean, atol=1e-5, rtol=0)


def test_an_edit_on_padded_sequences_is_an_error(models):
    """Key padding moves key 0 and the positions: the edit is refused in one line, never run on some rows only."""
    m, _ = models["mistral"]
    x = tokens(batch=2, length=40)
    keep = torch.ones_like(x)
    keep[1, :5] = 0
    for abl in (Ablation(Eviction(keep=1, window=2)), Ablation(Knockout())):
        with pytest.raises(RuntimeError, match="needs unpadded sequences"), torch.no_grad(), edits.carried(m):
            m.run_with_hooks(x, attention_mask=keep, fwd_hooks=ablation_hooks(m, abl))


def test_gemma2s_soft_capped_attention_carries_a_knockout_and_refuses_a_merged_eviction(tmp_path):
    """The soft-capped path carries a knockout as the kernels' op does: with a cap far above every score (10^4:
    c·tanh(s/c) = s to ~1e-9 here) it gives the ablated logits of the uncapped model, whose edit the op carries out.
    An eviction whose kept keys need a second attention merged by lse (the sliding layer's window, 4, is wider than
    w = 2) is refused in one line, never run unedited."""
    from probe.checkpoints.adapters import adapt

    d = build_tiny("gemma2", tmp_path / "gemma2")

    def load(cap):
        hf = AutoModelForCausalLM.from_pretrained(
            d, attn_implementation="eager", dtype=torch.float32, attn_logit_softcapping=cap
        )
        return adapt(hf.eval())

    capped, plain, x = load(1e4), load(None), tokens(length=20)
    assert capped.probe_info.extra["attn_logit_softcap"] == 1e4 and plain.probe_info.extra["attn_logit_softcap"] is None
    knockout = Ablation(Knockout())
    want = ablated_logits(plain, x, knockout)
    assert (want - logits(plain(x))).abs().max() > 1e-3  # the edit matters
    torch.testing.assert_close(ablated_logits(capped, x, knockout), want, atol=1e-5, rtol=0)
    with pytest.raises(RuntimeError, match="cannot be carried through Gemma 2's soft-capped attention"):
        ablated_logits(capped, x, Ablation(Eviction(keep=1, window=2)))


class Allocations(TorchDispatchMode):
    """Every tensor an op returns: the largest (elements) and the peak of the bytes alive at once (distinct storages,
    released when their last tensor is collected); a tracemalloc for torch's CPU tensors."""

    def __init__(self):
        super().__init__()
        self.live, self.counts, self.bytes, self.peak, self.largest = {}, {}, 0, 0, 0

    def _release(self, key):
        self.counts[key] -= 1
        if not self.counts[key]:
            self.bytes -= self.live.pop(key)
            del self.counts[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
                continue
            self.largest = max(self.largest, t.numel())
            key = t.untyped_storage().data_ptr()
            if key not in self.live:
                self.live[key] = t.untyped_storage().nbytes()
                self.bytes += self.live[key]
                self.peak = max(self.peak, self.bytes)
            self.counts[key] = self.counts.get(key, 0) + 1
            weakref.finalize(t, self._release, key)
        return out


@pytest.mark.parametrize("abl", [Ablation(Eviction(keep=4, window=8)), Ablation(Knockout())], ids=["evict", "knockout"])
def test_ablated_forwards_allocate_nothing_quadratic_and_memory_grows_linearly(models, abl, small_blocks):
    """gemma3_text at T = 512, 1024, 2048: no tensor of T²/4 elements or more, and the peak of live bytes at 4T is
    at most 4.5x that at T (quadratic growth would give 16x; the logits, B x T x vocab, dominate at these sizes)."""
    m, _ = models["gemma3_text"]
    peaks = {}
    for length in (512, 1024, 2048):
        x = tokens(length=length, seed=length)
        with Allocations() as seen:
            ablated_logits(m, x, abl)
        assert seen.largest < length * length // 4, (length, seen.largest)
        peaks[length] = seen.peak
    assert peaks[2048] <= 4.5 * peaks[512], peaks
