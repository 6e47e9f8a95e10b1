"""Corpora, tokenizers and fixed evaluation batches.

Imports are lazy: ``probe.data.load_corpus`` costs nothing until used, and tokenizers pull in transformers only then.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "Corpus": "corpus",
    "CORPORA": "corpus",
    "load_corpus": "corpus",
    "DEFAULT_EVAL_CORPUS": "corpus",
    "HELDOUT": "corpus",
    "split_heldout": "corpus",
    "train_bpe": "tokenizer",
    "load_tokenizer": "tokenizer",
    "TOKENIZERS": "tokenizer",
    "DEFAULT_TOKENIZER": "tokenizer",
    "prepends_bos": "tokenizer",
    "tokenize_documents": "batches",
    "WindowSampler": "batches",
    "EvalBatches": "batches",
    "eval_batches": "batches",
    "cap_ctx": "batches",
    "BigramBackcopy": "synthetic",
    "BBSampler": "synthetic",
    "BBWindows": "synthetic",
    "parse_synthetic": "synthetic",
    "is_synthetic": "synthetic",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"probe.data.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'probe.data' has no attribute {name!r}")
