"""probe.load / probe.checkpoints.load.resolve: name resolution, local directories, zoo, GGUF, custom checkpoints,
offline."""

from __future__ import annotations

import json
import sys
import time
import types

import numpy as np
import pytest
import torch

import probe
from probe.checkpoints import load as L
from probe.checkpoints.adapters import GPTNeoXAdapter, GptOssAdapter, LlamaAdapter
from probe.checkpoints.tiny import build_tiny, tiny_model


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return {fam: build_tiny(fam, root / fam) for fam in ("gpt_neox", "gpt_oss", "llama")}


# ---------------------------------------------------------------------------------------------------- resolve


@pytest.mark.parametrize(
    "name, expected",
    [
        ("pythia-410m", ("EleutherAI/pythia-410m", None, "hub")),
        ("pythia-1.4b-deduped", ("EleutherAI/pythia-1.4b-deduped", None, "hub")),
        ("pythia-70m@step1000", ("EleutherAI/pythia-70m", "step1000", "hub")),
        ("pythia-160m-deduped@step0", ("EleutherAI/pythia-160m-deduped", "step0", "hub")),
        ("pythia-12b@512", ("EleutherAI/pythia-12b", "step512", "hub")),
        ("EleutherAI/pythia-2.8b@step143000", ("EleutherAI/pythia-2.8b", "step143000", "hub")),
        ("pythia-14m", ("EleutherAI/pythia-14m", None, "hub")),
        ("gpt-oss-20b", ("openai/gpt-oss-20b", None, "hub")),
        ("gpt-oss-120b", ("openai/gpt-oss-120b", None, "hub")),
        ("meta-llama/Llama-3.2-1B", ("meta-llama/Llama-3.2-1B", None, "hub")),
        ("Qwen/Qwen2.5-0.5B@main", ("Qwen/Qwen2.5-0.5B", "main", "hub")),
        ("gpt2", ("gpt2", None, "hub")),
    ],
)
def test_resolve_names(name, expected):
    assert L.resolve(name) == expected


@pytest.mark.parametrize("name", ["pythia-70m@step1500", "pythia-70m@step3", "pythia-70m@step144000"])
def test_resolve_rejects_missing_pythia_steps(name):
    with pytest.raises(L.ModelNotFoundError, match="no checkpoint at step"):
        L.resolve(name)


def test_resolve_rejects_malformed():
    with pytest.raises(ValueError):
        L.resolve("a@b@c")
    with pytest.raises(ValueError):
        L.resolve("not a name!")
    with pytest.raises(ValueError):
        L.resolve("")
    with pytest.raises(L.ModelNotFoundError, match="no model directory"):
        L.resolve("./definitely/not/here")


def test_resolve_local_dir_and_gguf(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    with pytest.raises(L.ModelNotFoundError, match="no config.json"):
        L.resolve(str(d))
    (d / "config.json").write_text("{}")
    assert L.resolve(str(d)) == (str(d.resolve()), None, "local")
    assert L.resolve(d) == (str(d.resolve()), None, "local")  # Path objects too
    g = tmp_path / "x.gguf"
    with pytest.raises(L.ModelNotFoundError, match="GGUF file not found"):
        L.resolve(str(g))
    g.write_bytes(b"GGUF")
    assert L.resolve(str(g)) == (str(g.resolve()), None, "gguf")


def test_resolve_zoo(tmp_path, monkeypatch):
    monkeypatch.setattr(L, "ZOO_DIR", tmp_path)
    with pytest.raises(L.ModelNotFoundError, match="available: none yet"):
        L.resolve("probe/tiny-baseline")
    (tmp_path / "tiny-baseline").mkdir()
    (tmp_path / "tiny-baseline" / "config.json").write_text("{}")
    (tmp_path / "tiny-sink").mkdir()  # no config.json: not a checkpoint
    assert L.zoo_names() == ["tiny-baseline"]
    expected = (str(tmp_path / "tiny-baseline"), None, "zoo")
    assert L.resolve("probe/tiny-baseline") == expected
    assert L.resolve("tiny-baseline") == expected
    with pytest.raises(L.ModelNotFoundError, match=r"no zoo checkpoint 'tiny-sink'; available: tiny-baseline"):
        L.resolve("tiny-sink")
    (tmp_path / "bb-softpick").mkdir()  # the Bigram-Backcopy family answers to its bare name too
    (tmp_path / "bb-softpick" / "config.json").write_text("{}")
    assert L.resolve("bb-softpick") == L.resolve("probe/bb-softpick") == (str(tmp_path / "bb-softpick"), None, "zoo")
    with pytest.raises(L.ModelNotFoundError, match=r"no zoo checkpoint 'bb-sink'; available: bb-softpick, tiny-base"):
        L.resolve("bb-sink")


def test_known_checkpoints_and_listing():
    kc = L.KNOWN_CHECKPOINTS
    assert kc["pythia-410m"] == "EleutherAI/pythia-410m"
    assert kc["pythia-6.9b-deduped"] == "EleutherAI/pythia-6.9b-deduped"
    assert kc["gpt-oss-120b"] == "openai/gpt-oss-120b"
    assert all(L.resolve(short)[0] == repo for short, repo in kc.items())
    rows = L.list_models()
    assert {r["name"] for r in rows} >= set(kc)
    assert all(set(r) == {"name", "source", "kind", "available"} for r in rows)


# ---------------------------------------------------------------------------------------------------- offline


def test_offline_missing_model_is_one_fast_line():
    t0 = time.perf_counter()
    with pytest.raises(L.ModelNotFoundError) as e:
        probe.load("probe-nonexistent-org/no-such-model-xyz")
    assert time.perf_counter() - t0 < 5
    msg = str(e.value)
    assert "\n" not in msg and "probe-nonexistent-org/no-such-model-xyz" in msg and "local directory" in msg
    assert e.value.__cause__ is None and (e.value.__context__ is None or e.value.__suppress_context__)
    assert isinstance(e.value, ValueError)


def test_offline_mode_names_model_and_revision(monkeypatch):
    if L._cached_config("EleutherAI/pythia-410m", "step1000") is not None:
        pytest.skip("pythia-410m@step1000 is in the local cache")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t0 = time.perf_counter()
    with pytest.raises(L.ModelNotFoundError, match=r"EleutherAI/pythia-410m@step1000 is not in the local"):
        probe.load("pythia-410m@step1000")
    assert time.perf_counter() - t0 < 2


def test_unreachable_hub_is_not_contacted(monkeypatch):
    """With the hub unreachable no download is attempted (no retry stack)."""
    import huggingface_hub

    monkeypatch.setattr(L, "_hub_reachable", lambda timeout=2.0: False)
    monkeypatch.setattr(
        huggingface_hub, "hf_hub_download", lambda *a, **k: pytest.fail("tried to download while offline")
    )
    with pytest.raises(L.ModelNotFoundError, match="hub is unreachable"):
        probe.load("gpt-oss-20b")


def test_revision_conflict():
    with pytest.raises(ValueError, match="conflicts"):
        probe.load("pythia-70m@step1000", revision="step2000")


# ---------------------------------------------------------------------------------------------------- local loads


@pytest.mark.parametrize(
    "family, cls", [("gpt_neox", GPTNeoXAdapter), ("gpt_oss", GptOssAdapter), ("llama", LlamaAdapter)]
)
def test_load_local_dir(tiny_dirs, family, cls):
    m = probe.load(str(tiny_dirs[family]))
    assert isinstance(m, cls)
    assert m.probe_info.family == family and m.probe_info.name == str(tiny_dirs[family].resolve())
    assert m.probe_info.extra["source"] == "local"
    assert m.tokenizer is not None and m.tokenizer("w5 w7")["input_ids"] == [5, 7]
    assert m.hf_model.config._attn_implementation == "probe"
    assert not m.training
    assert next(m.parameters()).dtype == torch.float32
    out = m("w3 w4 w5")  # text goes through the tokenizer
    assert out.logits.shape == (1, 3, 96)


def test_load_dtype_device_and_missing_tokenizer(tmp_path):
    tiny_model("llama").save_pretrained(tmp_path / "notok")
    m = probe.load(tmp_path / "notok", dtype="float64", device="cpu")
    assert m.tokenizer is None
    assert next(m.parameters()).dtype == torch.float64
    assert m(torch.tensor([[3, 4, 5]])).logits.dtype == torch.float64


def test_load_custom_probe_checkpoint_returned_as_is(tmp_path, monkeypatch, tiny_dirs):
    """model_type 'probe' goes through AutoModelForCausalLM after `import probe.models`, un-adapted."""
    import transformers

    from probe.hooks.info import ModelInfo

    d = tmp_path / "custom"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "probe"}))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (d / f).write_bytes((tiny_dirs["llama"] / f).read_bytes())
    imported = []
    fake = types.ModuleType("probe.models")
    monkeypatch.setitem(sys.modules, "probe.models", fake)
    monkeypatch.setattr(probe, "models", fake, raising=False)

    class Custom(torch.nn.Module):
        probe_info = ModelInfo(
            name="custom",
            family="probe",
            n_layers=1,
            d_model=4,
            n_heads=1,
            n_kv_heads=1,
            d_head=4,
            n_ctx=8,
            vocab_size=96,
        )

    def fake_from_pretrained(path, **kw):
        imported.append((path, kw))
        return Custom()

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fake_from_pretrained)
    m = probe.load(str(d))
    assert type(m) is Custom and imported[0][0] == str(d.resolve())
    assert "attn_implementation" not in imported[0][1]
    assert m.tokenizer is not None


# ---------------------------------------------------------------------------------------------------- GGUF


def _permute_for_gguf(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row permutation (rotate-half pairs → interleaved pairs); transformers undoes it on load."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_llama_gguf(model, path):
    gguf = pytest.importorskip("gguf")
    c = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-llama")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    w.add_vocab_size(c.vocab_size)
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    w.add_tensor("output.weight", sd["lm_head.weight"])
    names = {
        "attn_q": "self_attn.q_proj",
        "attn_k": "self_attn.k_proj",
        "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj",
        "ffn_gate": "mlp.gate_proj",
        "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj",
        "attn_norm": "input_layernorm",
        "ffn_norm": "post_attention_layernorm",
    }
    for i in range(c.num_hidden_layers):
        for g, h in names.items():
            t = sd[f"model.layers.{i}.{h}.weight"]
            if g == "attn_q":
                t = _permute_for_gguf(t, c.num_attention_heads)
            elif g == "attn_k":
                t = _permute_for_gguf(t, c.num_key_value_heads)
            w.add_tensor(f"blk.{i}.{g}.weight", np.ascontiguousarray(t))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_load_gguf_matches_source(tmp_path, monkeypatch):
    monkeypatch.setenv("PROBE_CACHE", str(tmp_path / "cache"))  # the conversion goes here, not into the user cache
    src = tiny_model("llama", seed=3)
    path = write_llama_gguf(src, tmp_path / "tiny-llama.gguf")
    m = probe.load(str(path))
    assert isinstance(m, LlamaAdapter) and m.probe_info.extra["source"] == "gguf"
    assert m.probe_info.n_kv_heads == 2 and m.probe_info.n_layers == 2
    ids = torch.randint(2, 96, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = src(ids).logits
        got = m(ids).logits
        _, cache = m.run_with_cache(ids, names_filter=lambda n: n.endswith("hook_pattern"))
    assert ref.abs().max() > 1e-2
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        hf_attn = src(ids, output_attentions=True).attentions
    torch.testing.assert_close(cache["blocks.1.attn.hook_pattern"], hf_attn[1], atol=1e-6, rtol=0)


def test_a_conversion_parses_the_gguf_once(tmp_path, monkeypatch):
    """transformers reads the file for the config, the weights and the tokenizer; probe's conversion hands all three
    one reader (the parse is most of Gemma's conversion), and gguf.GGUFReader is gguf's own again afterwards."""
    gguf = pytest.importorskip("gguf")
    monkeypatch.setenv("PROBE_CACHE", str(tmp_path / "cache"))
    parsed = []

    class CountingReader(gguf.GGUFReader):
        def __init__(self, path, *args, **kwargs):
            parsed.append(str(path))
            super().__init__(path, *args, **kwargs)

    monkeypatch.setattr(gguf, "GGUFReader", CountingReader)
    path = write_llama_gguf(tiny_model("llama", seed=3), tmp_path / "tiny-llama.gguf")
    m = probe.load(str(path))
    assert m.probe_info.extra["source"] == "gguf" and parsed == [str(path.resolve())]
    assert gguf.GGUFReader is CountingReader


def test_load_zoo_checkpoint(tmp_path, monkeypatch, tiny_dirs):
    import shutil

    monkeypatch.setattr(L, "ZOO_DIR", tmp_path)
    shutil.copytree(tiny_dirs["llama"], tmp_path / "tiny-llamaish")
    m = probe.load("probe/tiny-llamaish")
    assert isinstance(m, LlamaAdapter)
    assert m.probe_info.name == "probe/tiny-llamaish" and m.probe_info.extra["source"] == "zoo"
    assert probe.load("tiny-llamaish").probe_info.name == "probe/tiny-llamaish"


def test_load_real_custom_model(tmp_path):
    """A saved ProbeForCausalLM comes back through probe.load as itself (already hooked)."""
    pm = pytest.importorskip("probe.models")
    src = pm.create("baseline", n_layers=2, d_model=32, n_heads=4, d_mlp=64, n_ctx=32, vocab_size=97).eval()
    src.save_pretrained(tmp_path / "custom")
    m = probe.load(tmp_path / "custom")
    assert type(m) is pm.ProbeForCausalLM and hasattr(m, "probe_info")
    x = torch.randint(0, 97, (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(m(x).logits, src(x).logits, atol=0, rtol=0)


def test_load_hub_name_from_local_cache(tmp_path, monkeypatch, tiny_dirs):
    """The hub path (name → repo@revision → cache → from_pretrained) on a hand-built HF cache, hub unreachable."""
    import shutil

    cache = tmp_path / "hub"
    repo = cache / "models--EleutherAI--pythia-70m"
    commit = "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(tiny_dirs["gpt_neox"], repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "step1000").write_text(commit)
    monkeypatch.setattr(L, "_hub_reachable", lambda timeout=2.0: False)
    m = probe.load("pythia-70m@step1000", cache_dir=cache)
    assert isinstance(m, GPTNeoXAdapter) and m.tokenizer is not None
    assert m.probe_info.name == "EleutherAI/pythia-70m@step1000"
    assert m.probe_info.extra["revision"] == "step1000" and m.probe_info.extra["source"] == "hub"
    with pytest.raises(L.ModelNotFoundError, match="pythia-70m@step2000"):  # another revision is not cached
        probe.load("pythia-70m", revision="step2000", cache_dir=cache)
