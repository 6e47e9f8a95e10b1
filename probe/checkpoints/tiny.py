"""Tiny random HF checkpoints that carry the real architectures' quirks (docs/definitions.md#hf-checkpoints), for
offline tests and demos.

``build_tiny(family, directory)`` writes ``config.json``, safetensors weights and a word-level tokenizer
(tokens ``w2 … w{V-1}``, onto which English words map too: :func:`tiny_tokenizer`) to ``directory`` and returns it.
Quirks kept: GPT-NeoX — q|k|v interleaved per head in ``query_key_value``, rotary on 25% of head dims, parallel
residual, QKV bias, untied embeddings; gpt-oss — learned sinks (set to randn·3 so they matter), sliding/full
``layer_types`` with a window shorter than test sequences, GQA, MoE, QKV bias, YaRN rope; llama — GQA;
gemma2/gemma3_text/qwen2/qwen3/mistral — see :func:`more_tiny_config`.
"""

from __future__ import annotations

from pathlib import Path

import torch

FAMILIES = ("gpt_neox", "gpt_oss", "llama", "gemma2", "gemma3_text", "qwen2", "qwen3", "mistral")
MORE_FAMILIES = FAMILIES[3:]  # configs in more_tiny_config
VOCAB = 96


def tiny_config(family: str, vocab_size: int = VOCAB):
    from transformers import GPTNeoXConfig, GptOssConfig, LlamaConfig

    if family == "gpt_neox":
        return GPTNeoXConfig(
            vocab_size=vocab_size,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            rotary_pct=0.25,
            use_parallel_residual=True,
            attention_bias=True,
            max_position_embeddings=128,
            tie_word_embeddings=False,
            bos_token_id=0,
            eos_token_id=1,
        )
    if family == "gpt_oss":
        return GptOssConfig(
            vocab_size=vocab_size,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            intermediate_size=32,
            num_local_experts=4,
            num_experts_per_tok=2,
            sliding_window=4,
            layer_types=["sliding_attention", "full_attention"],
            attention_bias=True,
            max_position_embeddings=131072,
            rope_parameters={
                "rope_type": "yarn",
                "factor": 32.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": False,
                "original_max_position_embeddings": 4096,
                "rope_theta": 150000.0,
            },
            tie_word_embeddings=False,
            pad_token_id=1,
            bos_token_id=0,
            eos_token_id=1,
        )
    if family == "llama":
        return LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=64,
            max_position_embeddings=128,
            tie_word_embeddings=False,
            bos_token_id=0,
            eos_token_id=1,
        )
    if family in MORE_FAMILIES:
        return more_tiny_config(family, vocab_size)
    from transformers import CONFIG_MAPPING

    if family not in CONFIG_MAPPING:
        raise ValueError(f"unknown tiny family {family!r}: choose from {FAMILIES} or any transformers model_type")
    from probe.checkpoints.tiny_configs import auto_tiny_config

    return auto_tiny_config(family)  # any other model_type, with its features switched on (tiny_configs)


# The 40 most frequent words of the bundled wikitext-2-test (whitespace-separated, case-folded; ``<unk>`` left out),
# most frequent first: the tiny tokenizer gives each its own id (tests/checkpoints/test_tiny_tokenizer.py checks them).
TEXT_WORDS = (
    *("the", ",", ".", "of", "and", "in", "to", "a", "=", "was", '"', "@-@", "on", "(", ")", "as", "that", "for"),
    *("with", "by", "'s", "he", "at", "his", "is", "were", "from", "it", "had", "an", "which", ";", "are", "@.@"),
    *("be", "first", "also", "this", "but", "its"),
)
_WORD = r"(?<!\S)(?!w\d+(?!\S))"  # the start of a whitespace-separated word that is not already a w{i}


def text_word_patterns() -> list[str]:
    """The regexes, in the order they apply, that map each whitespace-separated word of text to one ``w{i}`` (the k-th
    pattern: w{2 + k}): a word of :data:`TEXT_WORDS` (any case), a word starting with a digit, a word starting with
    each letter a-z (any case; up to 5 characters, then longer), then any other word. A word that is already ``w{i}``
    is left alone, so ``w5`` stays id 5 and ``w0``, ``w1`` or ``w400`` stay unknown."""
    import re

    words = [rf"(?i:{re.escape(w)})(?!\S)" for w in TEXT_WORDS]
    letters = [f"[{c}{c.upper()}]" + rest for c in "abcdefghijklmnopqrstuvwxyz" for rest in (r"\S{0,4}(?!\S)", r"\S*")]
    return [_WORD + body for body in (*words, r"\d\S*", *letters, r"\S+")]


def tiny_tokenizer(vocab_size: int = VOCAB):
    """A word-level tokenizer: ``<unk>``=0 (also BOS), ``<eos>``=1 (also pad), ``w{i}`` = i for i ≥ 2, and English
    text in the same ids: a normalizer rewrites each whitespace-separated word that is not a ``w{i}`` to one
    (:func:`text_word_patterns`; ids 2 … 95, taken in turn below a vocabulary of 96), so text keeps its word count,
    frequent words get ids of their own and only a literal ``<unk>`` (WikiText's) or an out-of-range ``w{i}`` is
    unknown. Ids decode to ``w{i}``. All of it serialises to tokenizer.json (regex ``Replace`` normalizers)."""
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<eos>": 1, **{f"w{i}": i for i in range(2, vocab_size)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    if vocab_size > 2:
        ids = range(2, vocab_size)
        patterns = text_word_patterns()
        tok.normalizer = normalizers.Sequence(
            [normalizers.Replace(Regex(p), f"w{ids[k % len(ids)]}") for k, p in enumerate(patterns)]
        )
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<unk>", eos_token="<eos>", pad_token="<eos>"
    )


def tiny_model(family: str, seed: int = 0, dtype=None, positions: int | None = None, overrides: dict | None = None):
    """A random tiny HF causal LM (eager attention) of ``family`` (one of FAMILIES or any transformers
    model_type): learned sinks, biases and norm gains drawn away from their initial values, so that each matters.
    ``positions``: the longest context, in place of the tiny config's (a learned position table grows with it);
    ``overrides``: config attributes set over the tiny config's."""
    from transformers import AutoModelForCausalLM

    from probe.checkpoints.tiny_configs import check_tiny

    config = tiny_config(family)
    if family not in FAMILIES:
        check_tiny(config)
    if positions is not None:
        config.max_position_embeddings = positions  # GPT-2's n_positions too (its attribute map)
    for key, value in (overrides or {}).items():
        setattr(config, key, value)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    if model._can_set_experts_implementation():  # an expert loop, which any dtype runs (grouped_mm: no fp64)
        model.set_experts_implementation("eager")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".sinks"):  # gpt-oss style sink logits start at 0
                p.copy_(torch.randn_like(p) * 3)
            if name.endswith(".correct_output_scale"):  # Gemma 3n's starts at 0, which switches its per-layer write off
                p.copy_(torch.randn_like(p))
        for name, b in model.named_buffers():
            if name.endswith(".tid2eid"):  # a hash router's token -> experts table starts at zeros: all to expert 0
                b.copy_(torch.randint(0, model.config.n_routed_experts, b.shape))
        # random init leaves biases at zero; make them matter
        for name, p in model.named_parameters():
            if name.endswith("bias") or name.endswith("_bias"):
                p.copy_(torch.randn_like(p) * 0.1)
        if family not in FAMILIES[:3]:
            _randomise_norms(model)
    if dtype is not None:
        model = model.to(dtype)
    return model.eval()


def build_tiny(family: str, directory: str | Path, seed: int = 0, positions: int | None = None) -> Path:
    directory = Path(directory)
    tiny_model(family, seed, positions=positions).save_pretrained(directory)
    tiny_tokenizer().save_pretrained(directory)
    return directory


# --------------------------------------------------------------------------------------------------------------
# more families: Gemma 2 and 3 (sandwich norms, sliding/full layers, query_pre_attn_scalar, soft-caps,
# QK-norm), and the llama-family models LlamaAdapter claims (Qwen2: QKV bias; Qwen3: QK-norm and a head width that is
# not d_model / heads; Mistral: a sliding window in every layer)


def more_tiny_config(family: str, vocab_size: int = VOCAB):
    from transformers import Gemma2Config, Gemma3TextConfig, MistralConfig, Qwen2Config, Qwen3Config

    common = dict(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=4,
        max_position_embeddings=128,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=1,
    )
    if family == "gemma3_text":  # like gemma-3-270m: one KV head, sliding layers then a full one, tied embeddings
        return Gemma3TextConfig(
            **common,
            num_hidden_layers=3,
            num_key_value_heads=1,
            head_dim=16,
            query_pre_attn_scalar=8,
            sliding_window=4,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"],
            tie_word_embeddings=True,
        )
    if family == "gemma2":  # no QK-norm: a wider init gives attention logits of several units, which the cap bends
        return Gemma2Config(
            **common,
            num_hidden_layers=2,
            num_key_value_heads=2,
            head_dim=16,
            query_pre_attn_scalar=8,
            sliding_window=4,
            initializer_range=0.25,
            layer_types=["sliding_attention", "full_attention"],
            attn_logit_softcapping=2.0,
            final_logit_softcapping=5.0,
            tie_word_embeddings=True,
        )
    if family == "qwen2":
        return Qwen2Config(**common, num_hidden_layers=2, num_key_value_heads=2, tie_word_embeddings=True)
    if family == "qwen3":
        return Qwen3Config(**common, num_hidden_layers=2, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True)
    if family == "mistral":
        return MistralConfig(
            **common, num_hidden_layers=2, num_key_value_heads=2, sliding_window=4, tie_word_embeddings=False
        )
    raise ValueError(f"unknown tiny family {family!r}; choose from {FAMILIES}")


def _randomise_norms(model):
    """Norm gains start at 1 (Gemma: at 0 in its 1 + w form), which would hide a norm applied at the wrong place."""
    for name, p in model.named_parameters():
        if "norm" in name and name.endswith("weight"):
            p.add_(torch.randn_like(p) * 0.3)
