"""The Python API checks token ids as the CLI checks its flags (probe.models.inputs): on a probe model, a tiny HF
llama adapter and a probe model saved and loaded through ``probe.load``, every entry point (``model(ids)``,
``forward(return_type=...)``, ``run_with_cache``, ``run_with_hooks``) answers a sequence past the model's context, ids
outside the vocabulary, float, 3-D or 0-D ids, an empty batch and no tokens with one line naming the value and what
is valid: an ``InputError``, both a ``ValueError`` and probe's ``UsageError``. Before, HF's llama returned logits for
T = 1000 past its 128 positions, probe's rotary model ran any T, and the rest were raw torch errors (or logits of an
empty batch)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

import probe
from probe.checkpoints import wrap
from probe.checkpoints.tiny import VOCAB, build_tiny, tiny_config
from probe.errors import UsageError
from probe.models import create
from probe.models.inputs import InputError, hf_context_limit, past_context
from tests.support import SMALL

N_CTX = SMALL["n_ctx"]  # 64: the probe models' context
HF_CTX = 128  # the tiny llama's max_position_embeddings


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """name -> (model, vocabulary size, maximum context)."""
    root = tmp_path_factory.mktemp("input_checks")
    torch.manual_seed(0)
    made = create("baseline", "tiny", **SMALL).eval()
    made.save_pretrained(root / "saved")
    llama = probe.load(str(build_tiny("llama", root / "llama")))
    V = made.config.vocab_size
    return {
        "probe": (made, V, N_CTX),
        "saved probe": (probe.load(root / "saved"), V, N_CTX),
        "hf llama": (llama, VOCAB, HF_CTX),
    }


NAMES = ("probe", "saved probe", "hf llama")
CALLS = {
    "model(ids)": lambda m, x: m(x).logits,
    "return_type": lambda m, x: m(x, return_type="logits"),
    "run_with_cache": lambda m, x: m.run_with_cache(x)[0],
    "run_with_hooks": lambda m, x: m.run_with_hooks(x, fwd_hooks=[]),
}


# case -> (V, n_ctx) -> (ids, the pattern of the one line)
BAD = {
    "T past the context": lambda V, n: (
        torch.randint(0, V, (1, n + 1)),
        rf"T={n + 1} exceeds the maximum context {n} ",
    ),
    "T = 1000": lambda V, n: (torch.randint(0, V, (1, 1000)), rf"T=1000 exceeds the maximum context {n} .*T 1\.\.{n}"),
    "T = 5000": lambda V, n: (torch.randint(0, V, (1, 5000)), rf"T=5000 exceeds the maximum context {n} .*T 1\.\.{n}"),
    "id = V": lambda V, n: (
        torch.tensor([[2, V, 3]]),
        rf"token id {V} is outside the vocabulary .*ids are 0\.\.{V - 1}",
    ),
    "id = -1": lambda V, n: (
        torch.tensor([[2, -1, 3]]),
        rf"token id -1 is outside the vocabulary .*ids are 0\.\.{V - 1}",
    ),
    "float ids": lambda V, n: (
        torch.tensor([[2.0, 3.0]]),
        rf"dtype torch.float32 .*pass integer ids 0\.\.{V - 1} as torch.long",
    ),
    "1-D float ids": lambda V, n: (torch.tensor([2.0, 3.0]), r"dtype torch.float32 \(shape \(2,\)\)"),
    "bool ids": lambda V, n: (torch.ones(1, 3, dtype=torch.bool), r"dtype torch.bool"),
    "3-D ids": lambda V, n: (torch.zeros(2, 3, 4, dtype=torch.long), r"shape \(2, 3, 4\): pass \(B,T\) .* or \(T,\)"),
    "0-D ids": lambda V, n: (torch.tensor(5), r"shape \(\): pass \(B,T\)"),
    "empty batch": lambda V, n: (torch.zeros(0, 5, dtype=torch.long), r"shape \(0, 5\): the batch is empty"),
    "no tokens": lambda V, n: (
        torch.zeros(2, 0, dtype=torch.long),
        rf"shape \(2, 0\): no tokens; pass 1\.\.{n} tokens",
    ),
    "a list of ids": lambda V, n: (
        [[2, 3, 4]],
        r"token ids of type list: pass a string, a list of strings or an integer",
    ),
}


def expect_one_line(call, pattern):
    with pytest.raises(InputError, match=pattern) as e:
        call()
    assert isinstance(e.value, ValueError) and isinstance(e.value, UsageError)
    assert "\n" not in str(e.value)
    return str(e.value)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("case", BAD)
@torch.no_grad()
def test_every_entry_point_refuses_bad_ids_in_one_line(models, name, case):
    m, V, n_ctx = models[name]
    x, pattern = BAD[case](V, n_ctx)
    for call in CALLS.values():
        line = expect_one_line(lambda: call(m, x), pattern)  # noqa: B023 (called at once)
        assert m.probe_info.name in line or "T=" not in line


@pytest.mark.parametrize("name", NAMES)
@torch.no_grad()
def test_the_largest_valid_input_runs(models, name):
    """T = the context, ids 0 and V-1, int32 ids and a 1-D sequence all run."""
    m, V, n_ctx = models[name]
    x = torch.randint(0, V, (2, n_ctx))
    x[0, 0], x[1, -1] = 0, V - 1
    assert m(x).logits.shape == (2, n_ctx, m.probe_info.vocab_size)
    torch.testing.assert_close(m(x.int()).logits, m(x).logits)
    assert m.run_with_cache(x[0, :5])[0].shape == (1, 5, m.probe_info.vocab_size)


@pytest.mark.parametrize("name", ("probe", "hf llama"))
@torch.no_grad()
def test_past_context_lifts_the_limit_for_rotary_models(models, name):
    """``past_context()``: a stream run past the training length on purpose (StreamingLLM's perplexity); the limit is
    back after it."""
    m, V, n_ctx = models[name]
    x = torch.randint(0, V, (1, n_ctx + 8))
    with past_context():
        assert m.run_with_cache(x)[0].shape[1] == n_ctx + 8
    expect_one_line(lambda: m(x), rf"T={n_ctx + 8} exceeds")


@torch.no_grad()
def test_learned_positions_refuse_past_the_context_even_inside_past_context():
    m = create("baseline", "tiny", **SMALL, pos="learned").eval()
    x = torch.randint(0, 100, (1, N_CTX + 1))
    expect_one_line(lambda: m(x), rf"T={N_CTX + 1} exceeds the maximum context {N_CTX}")
    with past_context(), pytest.raises(ValueError, match=f"exceeds the model's context n_ctx={N_CTX}"):
        m(x)


@torch.no_grad()
def test_a_kv_cache_counts_against_the_context(models):
    """HF forward with a KV cache (``cache``, formerly ``past_key_values``): the cached positions and the new
    ones together within the context."""
    m, V, n_ctx = models["hf llama"]
    out = m(torch.randint(0, V, (1, 100)), use_cache=True)
    cache = out.past_key_values
    assert m(torch.randint(0, V, (1, 28)), cache=cache, use_cache=True).logits.shape[1] == 28
    expect_one_line(
        lambda: m(torch.randint(0, V, (1, 1)), cache=cache),
        rf"T=1 after {n_ctx} cached positions exceeds the maximum context {n_ctx} .*pass T 1\.\.0",
    )


@torch.no_grad()
def test_inputs_embeds_pass_without_ids(models):
    m, V, _ = models["hf llama"]
    embeds = m.hf_model.get_input_embeddings()(torch.randint(0, V, (1, 6)))
    assert m(inputs_embeds=embeds).logits.shape == (1, 6, V)


def test_text_input_is_truncated_to_the_context_not_refused(models):
    m, _, n_ctx = models["hf llama"]
    with torch.no_grad():
        assert m.run_with_cache(" ".join(["w5"] * (n_ctx + 40)))[0].shape[1] == n_ctx


def test_hf_context_limit_follows_what_hf_runs():
    """max_position_embeddings, except a dynamic NTK rotary (HF rescales its frequencies for any length): no limit;
    YaRN's max_position_embeddings is already the extended context."""
    assert hf_context_limit(tiny_config("llama")) == HF_CTX
    assert hf_context_limit(tiny_config("gpt_oss")) == 131072  # YaRN, factor 32 over 4096
    dynamic = LlamaConfig(
        **{
            **tiny_config("llama").to_dict(),
            "rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
        }
    )
    assert hf_context_limit(dynamic) is None


@torch.no_grad()
def test_a_dynamic_rotary_model_runs_past_its_max_position_embeddings():
    config = tiny_config("llama")
    config.rope_parameters = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    torch.manual_seed(0)
    m = wrap(AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval())
    x = torch.randint(0, VOCAB, (1, HF_CTX + 20))
    assert m.run_with_cache(x)[0].shape == (1, HF_CTX + 20, VOCAB)
    expect_one_line(lambda: m(torch.tensor([[VOCAB]])), rf"token id {VOCAB} is outside")
