"""Folders saved and loaded the way a user's are: a config key the family's code never reads changes nothing probe
does (HF runs such a folder, so must probe), and an fp64 mixture of experts loaded from a folder runs (transformers'
grouped expert matmul has no fp64 kernel)."""

from __future__ import annotations

import json

import pytest
import torch

import probe
from probe.checkpoints.tiny import tiny_model
from tests.support.parity import fp64_throughout

IDS = torch.randint(2, 60, (2, 10), generator=torch.Generator().manual_seed(0))


def _saved(tmp_path, model_type, dtype=torch.float32, **config):
    model = tiny_model(model_type, dtype=dtype)
    model.save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    return model


def _hf_logits(folder, dtype):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager", dtype=dtype)
    hf.to(dtype)  # what transformers keeps in fp32 (a router) in the dtype asked, as probe.load makes it
    if hf._can_set_experts_implementation():
        hf.set_experts_implementation("eager")
    with torch.no_grad(), fp64_throughout():
        return hf(IDS).logits


@pytest.mark.parametrize("model_type", ["gpt2", "gpt_neo", "gptj", "opt", "gpt_neox"])
def test_a_stray_kv_head_count_is_ignored_as_hf_ignores_it(tmp_path, model_type):
    _saved(tmp_path, model_type, num_key_value_heads=2)
    model = probe.load(str(tmp_path))
    assert model.probe_info.n_kv_heads == model.probe_info.n_heads
    with torch.no_grad():
        got, cache = model.run_with_cache(IDS)
    assert (got - _hf_logits(str(tmp_path), torch.float32)).abs().max() <= 1e-5
    pattern = cache[probe.hooks.names.attn(0, "pattern")]
    assert torch.allclose(pattern.sum(-1), torch.ones(()), atol=1e-5)


def test_a_softcap_gemma3_never_applies_is_not_applied(tmp_path):
    _saved(tmp_path, "gemma3_text", attn_logit_softcapping=3.0)
    model = probe.load(str(tmp_path))
    assert model.probe_info.extra["attn_logit_softcap"] is None
    with torch.no_grad():
        got = model(IDS).logits
    assert (got - _hf_logits(str(tmp_path), torch.float32)).abs().max() <= 1e-5


def test_gemma2s_softcap_is_still_applied(tmp_path):
    _saved(tmp_path, "gemma2")
    model = probe.load(str(tmp_path))
    assert model.probe_info.extra["attn_logit_softcap"]


@pytest.mark.parametrize("model_type", ["mixtral", "qwen3_moe", "olmoe"])
def test_an_fp64_mixture_of_experts_loads_from_a_folder(tmp_path, model_type):
    _saved(tmp_path, model_type)
    model = probe.load(str(tmp_path), dtype=torch.float64)
    with torch.no_grad(), fp64_throughout():
        got = model(IDS).logits
    assert got.dtype == torch.float64
    assert (got - _hf_logits(str(tmp_path), torch.float64)).abs().max() <= 1e-10


@pytest.mark.parametrize(
    "model_type, key, value",
    [("cohere", "logit_scale", 0.25), ("granite", "logits_scaling", 4.0), ("minicpm3", "dim_model_base", 8),
     ("hyperclovax", "logits_scaling", 0.5)],
)  # fmt: skip
def test_unembed_scales_the_logits_as_the_family_does(tmp_path, model_type, key, value):
    """Losses are computed from the final hidden states through ``unembed`` (Gemma's vocabulary makes full logits
    large): a family whose forward scales its logits must be scaled the same way there."""
    _saved(tmp_path, model_type, **{key: value})
    model = probe.load(str(tmp_path))
    with torch.no_grad():
        want = model(IDS).logits
        got = model.unembed(model(IDS, return_hidden=True))
    assert (got - want).abs().max() <= 1e-5 * (1 + want.abs().max())
    assert (want - _hf_logits(str(tmp_path), torch.float32)).abs().max() <= 1e-5


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3_5_moe_text", "llama"])
def test_a_folder_tokenizer_of_the_generic_class_is_read_as_saved(tmp_path, model_type):
    """A folder whose tokenizer_config.json names the generic fast class keeps its own tokenizer.json: transformers
    5's AutoTokenizer would build the model_type's class (Qwen2's), which splits this word-level vocabulary into no
    tokens at all, so every text would be empty."""
    from probe.checkpoints.tiny import tiny_tokenizer

    _saved(tmp_path, model_type)
    tiny_tokenizer().save_pretrained(tmp_path)
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["tokenizer_class"] == "TokenizersBackend"
    tokenizer = probe.load(str(tmp_path)).tokenizer
    assert tokenizer("w3 w4 w5").input_ids == tiny_tokenizer()("w3 w4 w5").input_ids == [3, 4, 5]
