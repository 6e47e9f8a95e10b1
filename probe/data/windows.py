"""A model's evaluation windows (docs/definitions.md#evaluation-windows), BOS first by the BOS rule
(docs/definitions.md#bos-rule): the one window builder. The analyses' Python default (:func:`default_windows`) and the
command line's inputs (``probe.jobs.inputs``, which names the flags in its errors) both build windows here.

A model is read only through ``model.probe_info`` (context, family, ``trained_with_bos``), ``model.tokenizer`` and
``model.train_record`` (the BOS id a ``probe train --bos`` run used), so this module needs nothing above the data.
Errors are ``ValueError``s with one-line messages.
"""

from __future__ import annotations

import dataclasses
import itertools

import torch

from probe.catalogue import WINDOW_MODES
from probe.data.batches import DocumentTokens, EvalBatches, _corpus, _tokenizer, cap_ctx, eval_batches
from probe.data.corpus import DEFAULT_EVAL_CORPUS
from probe.data.tokenizer import DEFAULT_TOKENIZER, prepends_bos


def wants_bos(model, tokenizer) -> bool:
    """The BOS rule: windows built from text start with a BOS exactly when the tokenizer's encoding of plain text starts
    with its BOS (Gemma) or the model's training run records that it saw one (``ModelInfo.trained_with_bos``)."""
    return model.probe_info.trained_with_bos or prepends_bos(tokenizer)


def window_bos_id(model, tokenizer, bos: bool | None = None) -> int | None:
    """The id that starts each window, or None: ``bos`` (None: :func:`wants_bos`). A model trained with ``probe train
    --bos`` records the id it used (the EOS of a tokenizer without a BOS token), which stands in when the tokenizer has
    none."""
    if not (wants_bos(model, tokenizer) if bos is None else bos):
        return None
    if tokenizer.bos_token_id is not None:
        return tokenizer.bos_token_id
    recorded = (getattr(model, "train_record", None) or {}).get("bos_id")
    if recorded is None:
        raise ValueError(f"bos=True but tokenizer {tokenizer.name_or_path!r} has no BOS token")
    return recorded


def eval_context(model, ctx: int | None = None) -> int:
    """Tokens per window: ``ctx`` (at most the model's maximum), else a probe model's training context and an HF
    checkpoint's min(1024, maximum context)."""
    info = model.probe_info
    if ctx is None and info.family == "probe":
        return info.n_ctx
    return cap_ctx(ctx, info.n_ctx)


def build_windows(
    corpus,
    tokenizer,
    *,
    n_batches: int = 8,
    batch_size: int = 8,
    ctx: int = 256,
    seed: int = 0,
    mode: str = "first",
    bos_id: int | None = None,
    docs=None,
    vocab_size: int | None = None,
) -> EvalBatches:
    """Fixed windows of ``corpus`` (a name, path or ``Corpus``; ``docs``: its documents tokenized with ``tokenizer``
    as a list of tensors or a :class:`probe.data.batches.DocumentTokens`, to reuse them across calls). ``mode`` is one
    of :data:`WINDOW_MODES`; with ``bos_id`` each window is
    that BOS followed by ctx text tokens. With ``vocab_size``, a token id the model cannot embed is an error."""
    tok = _tokenizer(tokenizer)
    if mode not in WINDOW_MODES:
        raise ValueError(f"unknown mode {mode!r}; choose one of {', '.join(WINDOW_MODES)}")
    if mode == "random" and tok.eos_token_id is None:
        raise ValueError(
            f"mode='random' joins documents with EOS, but tokenizer {tok.name_or_path!r} has no eos "
            "token; use mode='first' or 'sequential'"
        )
    corpus = _corpus(corpus)
    if docs is None:
        docs = DocumentTokens(corpus, tok)
    # auto (eval_batches): first when it has enough documents, else sequential (one sequential pass gives both), else
    # packed when none of the first block's documents holds a window
    try:
        eb = eval_batches(
            docs,
            tok,
            n_batches=n_batches,
            batch_size=batch_size,
            ctx=ctx,
            seed=seed,
            mode=mode,
            bos_id=bos_id,
        )
    except ValueError as e:
        raise ValueError(str(e).replace("corpus 'custom-tokens' ", f"corpus {corpus.name!r} ", 1)) from None
    eb = dataclasses.replace(eb, corpus=corpus.name, corpus_fingerprint=corpus.fingerprint)
    top = int(eb.tokens.max())
    if vocab_size is not None and top >= vocab_size:
        raise ValueError(
            f"tokenizer {eb.tokenizer!r} produces token id {top}, beyond the model's vocabulary of "
            f"{vocab_size}; pass a matching tokenizer"
        )
    return eb


def default_windows(
    model,
    corpus=None,
    *,
    n_batches: int = 8,
    batch_size: int = 8,
    ctx: int | None = None,
    seed: int = 0,
    tokenizer=None,
    mode: str = "first",
    bos: bool | None = None,
) -> EvalBatches:
    """The evaluation windows for a model: ``n_batches`` x ``batch_size`` fixed windows of ``corpus`` (default: the
    bundled WikiText-2 test split) at :func:`eval_context`, tokenized with ``tokenizer`` (a name or a tokenizer; default
    the model's own, custom models without one: the shipped probe-bpe-8k). ``bos`` None decides by :func:`wants_bos`
    (then each window is BOS + ctx-1 text tokens as input); True / False force it. ``bos`` is in the windows' meta."""
    tok = _tokenizer(tokenizer or getattr(model, "tokenizer", None) or DEFAULT_TOKENIZER)
    return build_windows(
        corpus or DEFAULT_EVAL_CORPUS,
        tok,
        n_batches=n_batches,
        batch_size=batch_size,
        ctx=eval_context(model, ctx),
        seed=seed,
        mode=mode,
        bos_id=window_bos_id(model, tok, bos),
    )


def batch_layout(n: int, batch_size: int) -> tuple[int, int]:
    """(batches, windows per batch) for ``n`` windows of which none is dropped: the largest batch of at most
    ``batch_size`` that divides ``n`` (60 texts at batch size 8: 10 x 6)."""
    b = max(d for d in range(1, min(batch_size, n) + 1) if n % d == 0)
    return n // b, b


@dataclasses.dataclass
class TextWindows(EvalBatches):
    """One window per text, texts in corpus order (docs/definitions.md#sink-eps-protocols): each window is the first
    ctx+1 tokens of the text encoded with the tokenizer's default special tokens (Gemma: its <bos> first), the model
    reading ctx of them. ``skipped``: texts passed over for being shorter than ctx+1 tokens."""

    skipped: int = 0

    def to_dict(self) -> dict:
        return {
            **super().to_dict(),
            "special_tokens": "tokenizer default",
            "text_order": "corpus order",
            "texts_skipped": self.skipped,
        }


def text_windows(
    corpus, tokenizer, *, n: int, ctx: int = 64, batch_size: int = 8, vocab_size: int | None = None
) -> TextWindows:
    """Gu et al.'s windows: the first ``n`` texts of ``corpus`` (in order) whose encoding with the tokenizer's default
    special tokens holds at least ctx+1 tokens, each cut to its first ctx+1 (ctx read, the next one a target only),
    laid out by :func:`batch_layout`. Fewer such texts than ``n``: all of them."""
    tok, corpus = _tokenizer(tokenizer), _corpus(corpus)
    if n < 1:
        raise ValueError(f"n={n} texts: ask for at least 1")
    if ctx < 2:
        raise ValueError(f"ctx={ctx} must be at least 2")
    rows, ids, skipped, chunk = [], [], 0, 64
    for start in itertools.count(0, chunk):  # tokenize (and read a streamed corpus) only as far as needed
        texts = corpus.documents[start : start + chunk]
        if not texts:
            break
        for i, x in enumerate(tok(texts, verbose=False)["input_ids"]):
            if len(rows) == n:
                break
            if len(x) < ctx + 1:
                skipped += 1
                continue
            rows.append(torch.tensor(x[: ctx + 1], dtype=torch.long))
            ids.append(start + i)
        if len(rows) == n:
            break
    if not rows:
        raise ValueError(
            f"corpus {corpus.name!r} has no text of at least {ctx + 1} tokens (with the tokenizer's "
            "special tokens); give longer texts"
        )
    nb, b = batch_layout(len(rows), batch_size)
    tokens = torch.stack(rows).view(nb, b, ctx + 1)
    top = int(tokens.max())
    if vocab_size is not None and top >= vocab_size:
        raise ValueError(
            f"tokenizer {tok.name_or_path!r} produces token id {top}, beyond the model's vocabulary of "
            f"{vocab_size}; pass a matching tokenizer"
        )
    bos = tok.bos_token_id is not None and bool((tokens[..., 0] == tok.bos_token_id).all())
    return TextWindows(
        tokens=tokens,
        doc_ids=torch.tensor(ids).view(nb, b),
        corpus=corpus.name,
        tokenizer=tok.name_or_path,
        seed=0,
        ctx=ctx,
        mode="texts",
        corpus_fingerprint=corpus.fingerprint,
        bos=bos,
        skipped=skipped,
    )


__all__ = [
    "WINDOW_MODES",
    "wants_bos",
    "window_bos_id",
    "eval_context",
    "build_windows",
    "default_windows",
    "batch_layout",
    "TextWindows",
    "text_windows",
]
