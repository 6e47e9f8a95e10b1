"""Token windows: seeded training windows and fixed evaluation batches.

Training draws windows of ctx+1 tokens at random (with replacement) from one stream in which documents are joined by
EOS; the sampler's state is a generator state plus a count, so a resumed run sees exactly the windows it would have.

Evaluation uses fixed windows that every model and condition shares (docs/definitions.md#evaluation-windows). Mode ``first`` takes the first ctx+1
tokens of each document long enough to hold them, visiting documents in a seeded random order, so each window is an
independent document for the document bootstrap. Mode ``sequential`` continues past one window per document when a
corpus has too few documents (WikiText-2 test has 60 articles, fewer than 8 x 8 windows): round r takes the r-th
non-overlapping window of each document, in the same seeded order, so its first round is exactly mode ``first``.
Mode ``random`` draws windows from the EOS-joined stream (a window may cross a document boundary; its document id is
that of its first token). Input is ``window[:-1]``, target ``window[1:]``: raw text, or with ``bos_id`` a BOS followed by
ctx text tokens (the model reads BOS + ctx-1 text tokens, as a model whose tokenizer prepends BOS saw text in training;
docs/definitions.md#bos-rule). Which models want a BOS is decided by :func:`probe.data.tokenizer.prepends_bos` and the caller.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from probe.data.corpus import Corpus, load_corpus
from probe.data.limits import available_memory, human_bytes
from probe.data.tokenizer import load_tokenizer

DEFAULT_MAX_EVAL_CTX = 1024


def _tokenizer(tokenizer):
    if isinstance(tokenizer, str):
        return load_tokenizer(tokenizer)
    return tokenizer


def _corpus(corpus) -> Corpus:
    """A ``Corpus`` from itself, a name or path, or a list of texts."""
    if isinstance(corpus, Corpus):
        return corpus
    if isinstance(corpus, (list, tuple)):
        return Corpus("custom-text", list(corpus), "in-memory list of texts")
    return load_corpus(corpus)


def tokenize_documents(corpus, tokenizer) -> list[torch.Tensor]:
    """One LongTensor of token ids per document: raw text, no BOS/EOS added. ``corpus``: Corpus, name or texts."""
    tok = _tokenizer(tokenizer)
    texts = _corpus(corpus).documents
    ids = tok(texts, add_special_tokens=False, verbose=False)["input_ids"] if texts else []
    return [torch.tensor(x, dtype=torch.long) for x in ids]


class WindowSampler:
    """Seeded random windows of ctx+1 tokens from the documents joined by ``eos_id``; with ``bos_id`` each window is
    that BOS followed by ctx text tokens (``probe train --bos``: the model always sees a BOS at position 0).

    ``sample(B)`` returns a (B, ctx+1) LongTensor; ``state_dict()``/``load_state_dict()`` save and restore the exact
    position in the sequence of draws (for training resume).
    """

    def __init__(self, docs_tokens: list[torch.Tensor], ctx: int, seed: int = 0, *, eos_id: int,
                 bos_id: int | None = None):
        if ctx < 1:
            raise ValueError(f"ctx={ctx} must be at least 1")
        if not docs_tokens:
            raise ValueError("no documents to sample windows from")
        eos = torch.tensor([eos_id], dtype=torch.long)
        parts = []
        for i, d in enumerate(docs_tokens):
            if i:
                parts.append(eos)
            parts.append(d.long().flatten())
        self.stream = torch.cat(parts)
        lengths = torch.tensor([len(d) + (1 if i + 1 < len(docs_tokens) else 0) for i, d in enumerate(docs_tokens)])
        self.doc_starts = torch.cumsum(lengths, 0) - lengths  # stream offset of each document (its EOS follows it)
        if len(self.stream) < ctx + 1:
            raise ValueError(f"the documents hold {len(self.stream)} tokens (EOS separators included); "
                             f"a window needs ctx+1 = {ctx + 1}")
        self.ctx, self.seed, self.count, self.bos_id = ctx, seed, 0, bos_id
        self.generator = torch.Generator().manual_seed(seed)

    def starts(self, batch_size: int) -> torch.Tensor:
        """Draw ``batch_size`` window start offsets (advances the state)."""
        s = torch.randint(0, len(self.stream) - self.ctx, (batch_size,), generator=self.generator)
        self.count += batch_size
        return s

    def windows(self, starts: torch.Tensor) -> torch.Tensor:
        if self.bos_id is None:
            return self.stream[starts[:, None] + torch.arange(self.ctx + 1)]
        text = self.stream[starts[:, None] + torch.arange(self.ctx)]  # (B, ctx)
        return torch.cat([torch.full_like(text[:, :1], self.bos_id), text], dim=1)  # (B, ctx + 1), BOS first

    def sample(self, batch_size: int) -> torch.Tensor:
        return self.windows(self.starts(batch_size))

    def document_of(self, positions: torch.Tensor) -> torch.Tensor:
        """Index of the document that holds each stream position (an EOS belongs to the document before it)."""
        return torch.searchsorted(self.doc_starts, positions, right=True) - 1

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state(), "count": self.count, "seed": self.seed, "ctx": self.ctx,
                "n_tokens": len(self.stream)}

    def load_state_dict(self, state: dict) -> None:
        for k, mine in (("ctx", self.ctx), ("n_tokens", len(self.stream))):
            if state[k] != mine:
                raise ValueError(f"sampler state has {k}={state[k]} but this sampler has {k}={mine}; "
                                 "resume with the same corpus, tokenizer and ctx")
        self.generator.set_state(state["generator"])
        self.count, self.seed = state["count"], state["seed"]


class TokenWindows:
    """Fixed windows ``tokens`` (N, B, ctx+1): iterating yields (B, ctx+1) batches; input ``[..., :-1]``, target
    ``[..., 1:]``. Shared by text windows (EvalBatches) and synthetic ones (probe.data.synthetic.BBWindows)."""

    tokens: torch.Tensor

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def __iter__(self):
        return iter(self.tokens)

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[1]

    @property
    def inputs(self) -> torch.Tensor:
        return self.tokens[..., :-1]

    @property
    def targets(self) -> torch.Tensor:
        return self.tokens[..., 1:]


@dataclass
class EvalBatches(TokenWindows):
    """Fixed evaluation windows: ``tokens`` (N, B, ctx+1), ``doc_ids`` (N, B); iterating yields (B, ctx+1) batches."""

    tokens: torch.Tensor
    doc_ids: torch.Tensor
    corpus: str
    tokenizer: str
    seed: int
    ctx: int
    mode: str = "first"
    corpus_fingerprint: str = ""
    bos: bool = False  # each window starts with the tokenizer's BOS, then ctx text tokens

    def to_dict(self) -> dict:
        """Metadata to record beside any result computed on these windows."""
        return {"corpus": self.corpus, "corpus_fingerprint": self.corpus_fingerprint, "tokenizer": self.tokenizer,
                "mode": self.mode, "seed": self.seed, "ctx": self.ctx, "n_batches": len(self),
                "batch_size": self.batch_size, "n_documents": int(self.doc_ids.unique().numel()), "bos": self.bos}


def eval_batches(corpus_or_docs, tokenizer, *, n_batches: int = 8, batch_size: int = 8, ctx: int = 256,
                 seed: int = 0, mode: str = "first", bos_id: int | None = None) -> EvalBatches:
    """Fixed windows of ctx+1 tokens from a corpus (name, path or ``Corpus``) or a list of token tensors.

    With ``bos_id`` each window is that token followed by ctx text tokens (so documents need ctx text tokens, not
    ctx+1); the text tokens of a window are the same ones a window without BOS starts with."""
    if n_batches < 1 or batch_size < 1:
        raise ValueError(f"n_batches={n_batches} and batch_size={batch_size} must both be at least 1")
    if ctx < 2:
        raise ValueError(f"ctx={ctx} must be at least 2")
    if mode not in ("first", "sequential", "random"):
        raise ValueError(f"unknown mode {mode!r}; choose 'first', 'sequential' or 'random'")
    window_bytes = n_batches * batch_size * (ctx + 1) * 8  # the int64 windows [n_batches, batch_size, ctx+1], any mode
    have = available_memory()
    if have is not None and window_bytes > have:
        raise ValueError(f"n_batches*batch_size={n_batches * batch_size} windows of {ctx + 1} tokens need "
                         f"{human_bytes(window_bytes)}, more than the {human_bytes(have)} of memory available; ask "
                         "for fewer windows or a smaller ctx")
    tok = _tokenizer(tokenizer)
    if isinstance(corpus_or_docs, list) and all(isinstance(d, torch.Tensor) for d in corpus_or_docs):
        name, fingerprint, docs = "custom-tokens", "", corpus_or_docs
    else:
        corpus = _corpus(corpus_or_docs)
        name, fingerprint, docs = corpus.name, corpus.fingerprint, tokenize_documents(corpus, tok)
    need = n_batches * batch_size
    g = torch.Generator().manual_seed(seed)
    text_ctx = ctx if bos_id is None else ctx - 1  # text tokens per window, minus one (the last is a target only)
    if mode in ("first", "sequential"):
        # round r takes the r-th non-overlapping window of every document long enough to hold it, documents in a
        # seeded order; mode 'first' stops after round 0 (one window per document).
        order, w = torch.randperm(len(docs), generator=g).tolist(), text_ctx + 1
        rounds = 1 if mode == "first" else max((len(d) // w for d in docs), default=0)
        picks = [(i, r) for r in range(rounds) for i in order if len(docs[i]) >= (r + 1) * w]
        if len(picks) < need:
            what = "documents with at least" if mode == "first" else "non-overlapping windows of"
            others = "mode='sequential' or 'random'" if mode == "first" else "mode='random'"
            raise ValueError(f"corpus {name!r} has {len(picks)} {what} {w} text tokens, so mode={mode!r} can supply "
                             f"{len(picks)} windows, not n_batches*batch_size={need}; ask for fewer windows, a smaller "
                             f"ctx, or {others}")
        ids = torch.tensor([i for i, _ in picks[:need]])
        tokens = torch.stack([docs[i][r * w:(r + 1) * w] for i, r in picks[:need]])
    else:
        n_tokens = sum(len(d) for d in docs) + max(len(docs) - 1, 0)
        if n_tokens < text_ctx + 1:
            raise ValueError(f"corpus {name!r} holds {n_tokens} tokens (EOS separators included), fewer than one "
                             f"window of {text_ctx + 1} text tokens; mode='random' can supply no windows")
        sampler = WindowSampler(docs, text_ctx, seed, eos_id=tok.eos_token_id)
        starts = sampler.starts(need)
        tokens, ids = sampler.windows(starts), sampler.document_of(starts)
    if bos_id is not None:
        tokens = torch.cat([torch.full((need, 1), int(bos_id), dtype=torch.long), tokens.long()], dim=1)
    return EvalBatches(tokens.view(n_batches, batch_size, ctx + 1).long(), ids.view(n_batches, batch_size), name,
                       tok.name_or_path, seed, ctx, mode, fingerprint, bos_id is not None)


def cap_ctx(ctx: int | None, n_ctx: int | None) -> int:
    """Evaluation context: ``None`` → min(model maximum, 1024) (docs/definitions.md#evaluation-windows); above the model's maximum is an error."""
    if ctx is None:
        return DEFAULT_MAX_EVAL_CTX if n_ctx is None else min(n_ctx, DEFAULT_MAX_EVAL_CTX)
    if ctx < 2:
        raise ValueError(f"ctx={ctx} must be at least 2")
    if n_ctx is not None and ctx > n_ctx:
        raise ValueError(f"ctx={ctx} exceeds the model's maximum context n_ctx={n_ctx}")
    return ctx
