"""probe's window eviction against StreamingLLM's own streaming evaluation (tests/fixtures/authors/streaming-llm/
{llama,gpt-neox}, written by scripts/authors/streaming_llm.py from mit-han-lab/streaming-llm at a pinned commit;
docs/definitions.md#window-eviction).

Their loop (examples/eval_long_ppl.py) runs one token per forward and trims the cache to start + recent keys after
every step with their StartRecentKVCache, so token t attends to keys 0 .. start-1 and t-recent .. t; with their
position-shift attention (ported to transformers 5.24 in the script) the cached keys sit at 0 .. L-1 and the query at
L = min(t, start + recent). probe runs one forward over the whole stream: ``Ablation(Eviction(start,
recent + 1, "cache"))`` through ``ablation_hooks`` under ``edits.carried(model)``. Tiny random Llama and
GPT-NeoX (partial rotary), a stream of 80 tokens, caches of 1 .. 15 keys: every token's loss equals theirs to 1e-12 in
fp64 (with the fixture's patches on both sides: fp64 RMSNorm and rotary angles) and 2e-5 in fp32. The port itself is
checked against their unported forward on transformers 4.33.0 (transformers-4.33.safetensors).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from probe.analyses.ablate import Ablation, Eviction, ablation_hooks
from probe.checkpoints.interop import wrap
from probe.kernels.sink_attention import edits
from tests.support import parity

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "authors" / "streaming-llm"
FAMILIES = ("llama", "gpt-neox")
TOLERANCE = {torch.float64: 1e-12, torch.float32: 2e-5}  # fp32: probe's one pass against their token-by-token loop
PREFIX = {torch.float64: "", torch.float32: "fp32/"}


def fixture(family: str):
    root = ROOT / family
    meta = json.loads((root / "meta.json").read_text())
    ids = load_file(root / "inputs.safetensors")["input_ids"]  # (1, T)
    return meta, load_file(root / "weights.safetensors"), ids, load_file(root / "outputs.safetensors")


def hf_model(family: str, meta: dict, weights: dict, dtype):
    """The fixture's transformers model (eager attention), its weights (their own names) loaded strictly in dtype."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, LlamaConfig, LlamaForCausalLM

    classes = {"llama": (LlamaConfig, LlamaForCausalLM), "gpt-neox": (GPTNeoXConfig, GPTNeoXForCausalLM)}
    config_class, model_class = classes[family]
    hf = model_class(config_class(**meta["config"], attn_implementation="eager")).to(dtype)  # fp64 weights stay fp64
    hf.load_state_dict(weights, strict=True)
    return hf.eval()


@contextlib.contextmanager
def fp64_throughout(hf):
    """The fixture's fp64 patches on probe's side of the comparison: transformers' fp32 casts of fp64 tensors lifted
    (``tests.support.parity.fp64_throughout``: RMSNorm's upcast, softmax's dtype), and the rotary embedding forming
    its angles in fp64 (transformers 5.24 forms them in fp32)."""
    rope = hf.base_model.rotary_emb

    def rotary(x, position_ids):
        emb = (position_ids[..., None].double() * rope.inv_freq.double()).repeat(1, 1, 2)
        return (emb.cos() * rope.attention_scaling).to(x.dtype), (emb.sin() * rope.attention_scaling).to(x.dtype)

    rope.forward = rotary
    try:
        with parity.fp64_throughout():
            yield
    finally:
        del rope.forward


@pytest.fixture(scope="module")
def cases():
    """(family, dtype) -> (probe's wrap of the fixture's model, its transformers model, ids, outputs, meta)."""
    out = {}
    for family in FAMILIES:
        meta, weights, ids, outputs = fixture(family)
        for dtype in (torch.float64, torch.float32):
            hf = hf_model(family, meta, weights, dtype)
            out[family, dtype] = (wrap(hf), ids, outputs, meta)
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_the_port_is_their_unported_code_on_the_transformers_it_was_written_for(family):
    """The script's port of their position-shift attention to transformers 5.24 gives every loss, logit and position
    of their own forward on transformers 4.33.0 (streaming_llm_original.py), fp64 and fp32 alike. Their loop without
    position shift gives the same numbers and positions on both versions too (fp32: transformers' eager attention
    differs between them in rounding)."""
    _, _, _, port = fixture(family)
    theirs = load_file(ROOT / family / "transformers-4.33.safetensors")
    caches = json.loads((ROOT / family / "meta.json").read_text())["settings"]["caches"]
    assert set(theirs) == set(port) and len(theirs) == 2 * 3 * (1 + 2 * len(caches))
    for key in theirs:
        if key.endswith("positions"):
            assert torch.equal(port[key], theirs[key]), key
            continue
        tol = 0 if "pos_shift/" in key else 1e-5 if key.startswith("fp32/") else 1e-12
        assert (port[key].double() - theirs[key].double()).abs().max() <= tol, key


def losses(model, ids, abl: Ablation | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-token NLL of tokens 1 .. T-1 (T - 1,), logits (T, V)) of one forward, ablated when ``abl`` is given."""
    hf = model.hf_model
    fp64 = fp64_throughout(hf) if hf.dtype == torch.float64 else contextlib.nullcontext()  # the fp32 run: unpatched
    with torch.no_grad(), edits.carried(model) if abl else contextlib.nullcontext(), fp64:
        out = model.run_with_hooks(ids, fwd_hooks=ablation_hooks(model, abl) if abl else [])
    logits = out if isinstance(out, torch.Tensor) else out.logits
    return F.cross_entropy(logits[0, :-1].double(), ids[0, 1:], reduction="none"), logits[0]


def their_eviction(start: int, recent: int, positions: str = "cache") -> Ablation:
    """probe's condition for their StartRecentKVCache(start, recent): the query is in the window, so w = recent + 1."""
    return Ablation(Eviction(keep=start, window=recent + 1, positions=positions))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
@pytest.mark.parametrize("family", FAMILIES)
def test_cache_positions_equal_their_position_shift_loop_on_every_token(cases, family, dtype):
    """Every token's loss and the kept rows' logits of probe's one pass equal their token-by-token loop with position
    shift, for every cache (start 0, 1, 2, 4; recent 0 .. 11; a stream 5-80x the cache); the mapping is checked by
    its neighbours: w = recent + 2 moves the losses."""
    model, ids, out, meta = cases[family, dtype]
    p, tol = PREFIX[dtype], TOLERANCE[dtype]
    rows = torch.tensor(meta["settings"]["logit_rows"])
    for start, recent in meta["settings"]["caches"]:
        key = f"{p}pos_shift/s{start}-r{recent}"
        nll, logits = losses(model, ids, their_eviction(start, recent))
        assert (nll - out[f"{key}/nll"]).abs().max() < tol, (start, recent)
        assert (logits[rows].double() - out[f"{key}/logits"].double()).abs().max() < tol, (start, recent)
        wider, _ = losses(model, ids, Ablation(Eviction(keep=start, window=recent + 2, positions="cache")))
        assert (wider - out[f"{key}/nll"]).abs().max() > 1e-3, (start, recent)


@pytest.mark.parametrize("family", FAMILIES)
def test_rows_inside_the_cache_are_dense_and_their_dense_loop_is_probes_clean_pass(cases, family):
    """Tokens t <= start + recent (nothing evicted yet) have the dense loss in both of their modes and in probe's
    eviction; probe's clean forward equals their loop without a cache policy (fp64)."""
    model, ids, out, meta = cases[family, torch.float64]
    clean, _ = losses(model, ids)
    assert (clean - out["dense/nll"]).abs().max() < 1e-12
    for start, recent in meta["settings"]["caches"]:
        inside = slice(0, start + recent + 1)
        for mode in ("pos_shift", "plain"):
            theirs = out[f"{mode}/s{start}-r{recent}/nll"]
            assert (theirs[inside] - clean[inside]).abs().max() < 1e-12, (mode, start, recent)
            assert (theirs[inside.stop :] - clean[inside.stop :]).abs().max() > 1e-2  # evicting matters past it
        nll, _ = losses(model, ids, their_eviction(start, recent))
        assert (nll[inside] - clean[inside]).abs().max() < 1e-12


@pytest.mark.parametrize("family", FAMILIES)
def test_their_cache_without_position_shift_is_neither_position_mode(cases, family):
    """Without position shift transformers gives each step's query (and the key it caches) the trimmed cache's length,
    min(t, start + recent), as position: past the cache every new key sits at one position, which is neither of
    probe's modes (original: t; within the cache: cached keys re-encoded at 0 .. L-1). Recorded, not matched."""
    model, ids, out, meta = cases[family, torch.float64]
    t = torch.arange(ids.shape[1] - 1)
    assert torch.equal(out["dense/positions"], t)
    for start, recent in meta["settings"]["caches"]:
        for mode in ("plain", "pos_shift"):
            assert torch.equal(out[f"{mode}/s{start}-r{recent}/positions"], t.clamp(max=start + recent))
        if recent == 0:  # one kept key at 0, the query at 1 in both of their modes: nothing to shift
            continue
        plain = out[f"plain/s{start}-r{recent}/nll"]
        for positions in ("original", "cache"):
            nll, _ = losses(model, ids, their_eviction(start, recent, positions))
            assert (nll - plain).abs().max() > 1e-3, (positions, start, recent)
