"""Token windows: seeded training windows and fixed evaluation batches.

Training draws windows of ctx+1 tokens at random (with replacement) from one stream in which documents are joined by
EOS; the sampler's state is a generator state plus a count, so a resumed run sees exactly the windows it would have.

Evaluation uses fixed windows that every model and condition shares (docs/definitions.md#evaluation-windows). Mode
``first`` takes the first ctx+1 tokens of each document long enough to hold them, visiting documents in a seeded random
order, so each window is an independent document for the document bootstrap. Mode ``sequential`` continues past one
window per document when a corpus has too few documents (WikiText-2 test has 60 articles, fewer than 8 x 8 windows):
round r takes the r-th non-overlapping window of each document, in the same seeded order, so its first round is exactly
mode ``first``. Mode ``random`` draws windows from the EOS-joined stream (a window may cross a document boundary; its
document id is that of its first token). Mode ``auto`` is ``first``, else ``sequential``, else ``packed`` when no
document of the first block of the seeded order (ORDER_BLOCK documents) holds a window, decided from that block alone,
so a corpus of millions of short records is never read whole. Input is ``window[:-1]``, target ``window[1:]``: raw
text, or with ``bos_id`` a BOS followed by ctx text tokens (the model reads BOS + ctx-1 text tokens, as a model whose
tokenizer prepends BOS saw text in training; docs/definitions.md#bos-rule). Which models want a BOS is decided by
:func:`probe.data.tokenizer.prepends_bos` and the caller.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from probe.data.corpus import Corpus, load_corpus
from probe.data.limits import check_windows_fit
from probe.data.tokenizer import load_tokenizer
from probe.writes import clean_text

DEFAULT_MAX_EVAL_CTX = 1024


def _tokenizer(tokenizer):
    if isinstance(tokenizer, str):
        return load_tokenizer(tokenizer)
    return tokenizer


def _corpus(corpus) -> Corpus:
    """A ``Corpus`` from itself, a name or path, or a list of texts."""
    if isinstance(corpus, Corpus):
        return corpus
    if isinstance(corpus, (list, tuple)):  # texts by the text rule: a lone surrogate becomes U+FFFD
        return Corpus("custom-text", [clean_text(t) for t in corpus], "in-memory list of texts")
    return load_corpus(corpus)


PIECE_CHARS = 1 << 20  # a longer document is tokenized in pieces (docs/definitions.md#long-documents)


def _encode(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False, verbose=False)["input_ids"]


def _cut(text: str) -> int:
    """Where a document of more than PIECE_CHARS characters is cut (docs/definitions.md#long-documents): after the last
    line break of its second half-piece, else before its last space there, else at PIECE_CHARS."""
    head = text[:PIECE_CHARS]
    at = head.rfind("\n", PIECE_CHARS // 2)
    if at >= 0:
        return at + 1
    at = head.rfind(" ", PIECE_CHARS // 2)
    return at if at > 0 else PIECE_CHARS


def piece_ids(tok, pieces):
    """The token ids of one document given as text pieces (any split), one list per piece of the cut rule
    (:func:`_cut`): a document of at most PIECE_CHARS characters is one list."""
    buf = ""
    for piece in pieces:
        buf += piece
        while len(buf) > PIECE_CHARS:
            at = _cut(buf)
            yield _encode(tok, buf[:at])
            buf = buf[at:]
    if buf:
        yield _encode(tok, buf)


def tokenize_pieces(tok, pieces, limit: int | None = None) -> torch.Tensor:
    """Token ids of one document given as text pieces, at most ``limit`` of them: the text is read only as far as the
    first ``limit`` tokens need."""
    ids, n = [], 0
    for x in piece_ids(tok, pieces):
        ids.append(x)
        n += len(x)
        if limit is not None and n >= limit:
            break
    flat = [t for x in ids for t in x]
    return torch.tensor(flat if limit is None else flat[:limit], dtype=torch.long)


def document_pieces(documents, i: int):
    """The text of document ``i`` in pieces: a streamed corpus reads it from its file
    (``probe.data.streams.FileDocuments.pieces``), a list holds it whole."""
    return documents.pieces(i) if hasattr(documents, "pieces") else iter((documents[i],))


def tokenize_documents(corpus, tokenizer) -> list[torch.Tensor]:
    """One LongTensor of token ids per document: raw text, no BOS/EOS added. ``corpus``: Corpus, name or texts. Every
    document is tokenized whole (documents in memory: in one batch); for windows, :func:`eval_batches` tokenizes
    only what they need."""
    tok = _tokenizer(tokenizer)
    texts = _corpus(corpus).documents
    if isinstance(texts, list) and all(len(t) <= PIECE_CHARS for t in texts):
        ids = tok(texts, add_special_tokens=False, verbose=False)["input_ids"] if texts else []
        return [torch.tensor(x, dtype=torch.long) for x in ids]
    return [tokenize_pieces(tok, document_pieces(texts, i)) for i in range(len(texts))]


class DocumentTokens:
    """The documents of a corpus (or token tensors) tokenized when asked for: the window builder's view. A streamed
    corpus (``probe.data.streams.FileDocuments``) is tokenized each time only as far as asked, so memory is bounded by
    the windows and not by the corpus; documents held in memory are tokenized whole once (in batches) and kept, so
    one ``DocumentTokens`` serves many window sets of one tokenizer."""

    def __init__(self, corpus_or_tokens, tok=None):
        self.tensors = corpus_or_tokens if isinstance(corpus_or_tokens, list) else None
        self.documents = None if self.tensors is not None else corpus_or_tokens.documents
        self.tok, self.kept = tok, {}
        self.streamed = self.documents is not None and hasattr(self.documents, "pieces")

    def __len__(self) -> int:
        return len(self.tensors if self.tensors is not None else self.documents)

    def available(self, k: int) -> int:
        """How many of the first ``k`` documents exist, reading a streamed corpus no further than document k."""
        if self.tensors is None and hasattr(self.documents, "available"):
            return self.documents.available(k)
        return min(k, len(self))

    def prefixes(self, indices, limit: int | None) -> dict[int, torch.Tensor]:
        """{i: the first ``limit`` tokens of document i (None: all)}, read in ascending order (a gzip file is read
        forward once)."""
        indices = sorted(set(indices))
        if self.streamed:
            return self._streamed_prefixes(indices, limit)
        if self.tensors is None:
            todo = [i for i in indices if i not in self.kept]
            short = [i for i in todo if len(self.documents[i]) <= PIECE_CHARS]
            if short:
                ids = self.tok([self.documents[i] for i in short], add_special_tokens=False, verbose=False)
                self.kept.update({i: torch.tensor(x, dtype=torch.long) for i, x in zip(short, ids["input_ids"])})
            self.kept.update(
                {i: tokenize_pieces(self.tok, iter((self.documents[i],))) for i in todo if i not in self.kept}
            )
        whole = self.tensors if self.tensors is not None else self.kept
        return {i: whole[i] if limit is None else whole[i][:limit] for i in indices}

    def _streamed_prefixes(self, indices, limit: int | None) -> dict[int, torch.Tensor]:
        """A streamed corpus's documents read in ascending order; the short ones (one piece of at most SHORT_CHARS)
        tokenized together in one call (the same ids: the same text, encoded whole), the rest piece by piece."""
        out, short = {}, []
        for i in indices:
            pieces = self.documents.pieces(i)
            first, second = next(pieces, ""), next(pieces, None)
            if second is None and len(first) <= SHORT_CHARS:
                short.append((i, first))
            else:
                whole = itertools.chain([first] if second is None else [first, second], pieces)
                out[i] = tokenize_pieces(self.tok, whole, limit)
        if short:
            ids = self.tok([t for _, t in short], add_special_tokens=False, verbose=False)["input_ids"]
            out.update({i: torch.tensor(x[:limit], dtype=torch.long) for (i, _), x in zip(short, ids)})
        return out


SHORT_CHARS = 1 << 16  # a streamed document this short is tokenized with others in one call


def token_stream(documents, tok, eos_id: int, folder) -> tuple[torch.Tensor, torch.Tensor]:
    """(the documents joined by ``eos_id`` as one token stream, each document's offset in it), for a corpus too large
    to hold as tokens: tokenized piece by piece into a temporary file in ``folder`` (2 bytes a token below 65536 ids,
    else 4) that backs the returned tensor, so memory holds what the windows touch, not the corpus. The file is
    unlinked at once (the mapping keeps it until the tensor goes); a killed run leaves at most a ``.probe-tmp-``
    leftover, which the next run under the folder's lock removes."""
    import numpy as np

    from probe.writes import TEMP_PREFIX, WriteError

    dtype = np.uint16 if len(tok) <= 1 << 16 else np.int32
    try:
        fd, name = tempfile.mkstemp(prefix=f"{TEMP_PREFIX}tokens.", dir=folder)
    except OSError as e:
        raise WriteError(Path(folder) / f"{TEMP_PREFIX}tokens", e) from None
    starts, n = [], 0
    try:
        with os.fdopen(fd, "wb") as f:
            for i in range(len(documents)):
                starts.append(n)
                if i:
                    f.write(np.array([eos_id], dtype=dtype).tobytes())
                    n += 1
                    starts[-1] = n
                for ids in piece_ids(tok, document_pieces(documents, i)):
                    f.write(np.asarray(ids, dtype=dtype).tobytes())
                    n += len(ids)
        stream = np.memmap(name, dtype=dtype, mode="c", shape=(n,)) if n else np.zeros(0, dtype=dtype)
    except OSError as e:  # a full disk while the stream is written: one line naming the file, exit code 1
        raise WriteError(name, e) from None
    finally:
        os.unlink(name)
    return torch.from_numpy(stream), torch.tensor(starts, dtype=torch.long)


class WindowSampler:
    """Seeded random windows of ctx+1 tokens from the documents joined by ``eos_id``; with ``bos_id`` each window is
    that BOS followed by ctx text tokens (``probe train --bos``: the model always sees a BOS at position 0).

    ``sample(B)`` returns a (B, ctx+1) LongTensor; ``state_dict()``/``load_state_dict()`` save and restore the exact
    position in the sequence of draws (for training resume).
    """

    def __init__(
        self,
        docs_tokens: list[torch.Tensor] | None,
        ctx: int,
        seed: int = 0,
        *,
        eos_id: int,
        bos_id: int | None = None,
        stream: tuple[torch.Tensor, torch.Tensor] | None = None,
    ):
        if ctx < 1:
            raise ValueError(f"ctx={ctx} must be at least 1")
        if stream is not None:  # already joined (``token_stream``: a large corpus, its tokens in a file)
            self.stream, self.doc_starts = stream
            if not len(self.doc_starts):
                raise ValueError("no documents to sample windows from")
        else:
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
            self.doc_starts = torch.cumsum(lengths, 0) - lengths  # stream offset of each document (its EOS follows)
        if len(self.stream) < ctx + 1:
            raise ValueError(
                f"the documents hold {len(self.stream)} tokens (EOS separators included); "
                f"a window needs ctx+1 = {ctx + 1}"
            )
        self.ctx, self.seed, self.count, self.bos_id = ctx, seed, 0, bos_id
        self.generator = torch.Generator().manual_seed(seed)

    def starts(self, batch_size: int) -> torch.Tensor:
        """Draw ``batch_size`` window start offsets (advances the state)."""
        s = torch.randint(0, len(self.stream) - self.ctx, (batch_size,), generator=self.generator)
        self.count += batch_size
        return s

    def windows(self, starts: torch.Tensor) -> torch.Tensor:
        if self.bos_id is None:
            return self.stream[starts[:, None] + torch.arange(self.ctx + 1)].long()
        text = self.stream[starts[:, None] + torch.arange(self.ctx)].long()  # (B, ctx)
        return torch.cat([torch.full_like(text[:, :1], self.bos_id), text], dim=1)  # (B, ctx + 1), BOS first

    def sample(self, batch_size: int) -> torch.Tensor:
        return self.windows(self.starts(batch_size))

    def document_of(self, positions: torch.Tensor) -> torch.Tensor:
        """Index of the document that holds each stream position (an EOS belongs to the document before it)."""
        return torch.searchsorted(self.doc_starts, positions, right=True) - 1

    def state_dict(self) -> dict:
        return {
            "generator": self.generator.get_state(),
            "count": self.count,
            "seed": self.seed,
            "ctx": self.ctx,
            "n_tokens": len(self.stream),
        }

    def load_state_dict(self, state: dict) -> None:
        for k, mine in (("ctx", self.ctx), ("n_tokens", len(self.stream))):
            if state[k] != mine:
                raise ValueError(
                    f"sampler state has {k}={state[k]} but this sampler has {k}={mine}; "
                    "resume with the same corpus, tokenizer and ctx"
                )
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
        return {
            "corpus": self.corpus,
            "corpus_fingerprint": self.corpus_fingerprint,
            "tokenizer": self.tokenizer,
            "mode": self.mode,
            "seed": self.seed,
            "ctx": self.ctx,
            "n_batches": len(self),
            "batch_size": self.batch_size,
            "n_documents": int(self.doc_ids.unique().numel()),
            "bos": self.bos,
        }


def eval_batches(
    corpus_or_docs,
    tokenizer,
    *,
    n_batches: int = 8,
    batch_size: int = 8,
    ctx: int = 256,
    seed: int = 0,
    mode: str = "first",
    bos_id: int | None = None,
) -> EvalBatches:
    """Fixed windows of ctx+1 tokens from a corpus (name, path or ``Corpus``), a list of token tensors, or a
    :class:`DocumentTokens` (its tokens reused).

    With ``bos_id`` each window is that token followed by ctx text tokens (so documents need ctx text tokens, not
    ctx+1); the text tokens of a window are the same ones a window without BOS starts with."""
    if n_batches < 1 or batch_size < 1:
        raise ValueError(f"n_batches={n_batches} and batch_size={batch_size} must both be at least 1")
    if ctx < 2:
        raise ValueError(f"ctx={ctx} must be at least 2")
    if mode not in ("first", "sequential", "random", "packed", "auto"):
        raise ValueError(f"unknown mode {mode!r}; choose 'first', 'sequential', 'random', 'packed' or 'auto'")
    check_windows_fit(  # the int64 windows [n_batches, batch_size, ctx+1], any mode
        n_batches * batch_size * (ctx + 1) * 8,
        f"n_batches*batch_size={n_batches * batch_size} windows of {ctx + 1} tokens",
        "ask for fewer windows or a smaller ctx",
    )
    tok = _tokenizer(tokenizer)
    if isinstance(corpus_or_docs, DocumentTokens):
        name, fingerprint, source = "custom-tokens", "", corpus_or_docs
    elif isinstance(corpus_or_docs, list) and all(isinstance(d, torch.Tensor) for d in corpus_or_docs):
        name, fingerprint, source = "custom-tokens", "", DocumentTokens(corpus_or_docs)
    else:
        corpus = _corpus(corpus_or_docs)
        name, fingerprint, source = corpus.name, corpus.fingerprint, DocumentTokens(corpus, tok)
    need = n_batches * batch_size
    g = torch.Generator().manual_seed(seed)
    text_ctx = ctx if bos_id is None else ctx - 1  # text tokens per window, minus one (the last is a target only)
    w = text_ctx + 1
    if mode in ("first", "sequential", "auto"):
        sep = _separator(tok) if mode == "auto" and _has_separator(tok) else None
        seq = "sequential" if mode == "auto" else mode
        got = _document_windows(source, seq, need, w, seeded_order(source, g), name, pack=sep is not None)
        if got is None:  # auto: no document of the first block holds a window; they are packed
            mode, (tokens, ids) = "packed", _packed_windows(source, need, w, sep, name, auto=True)
        else:
            tokens, ids = got
            if mode == "auto":  # one sequential pass gives both: first's windows exactly when no document gives two
                mode = "first" if len(set(ids.tolist())) == need else "sequential"
    elif mode == "packed":
        tokens, ids = _packed_windows(source, need, w, _separator(tok), name)
    elif source.streamed:
        tokens, ids = _random_windows_streamed(source, need, text_ctx, seed, tok.eos_token_id, name)
    else:
        docs = source.prefixes(range(len(source)), None)
        docs = [docs[i] for i in range(len(source))]
        n_tokens = sum(len(d) for d in docs) + max(len(docs) - 1, 0)
        if n_tokens < text_ctx + 1:
            raise ValueError(
                f"corpus {name!r} holds {n_tokens} tokens (EOS separators included), fewer than one "
                f"window of {text_ctx + 1} text tokens; mode='random' can supply no windows"
            )
        sampler = WindowSampler(docs, text_ctx, seed, eos_id=tok.eos_token_id)
        starts = sampler.starts(need)
        tokens, ids = sampler.windows(starts), sampler.document_of(starts)
    if bos_id is not None:
        tokens = torch.cat([torch.full((need, 1), int(bos_id), dtype=torch.long), tokens.long()], dim=1)
    return EvalBatches(
        tokens.view(n_batches, batch_size, ctx + 1).long(),
        ids.view(n_batches, batch_size),
        name,
        tok.name_or_path,
        seed,
        ctx,
        mode,
        fingerprint,
        bos_id is not None,
    )


def _has_separator(tok) -> bool:
    return tok.eos_token_id is not None or getattr(tok, "sep_token_id", None) is not None


def _separator(tok) -> int:
    """The id that joins documents in mode 'packed': the tokenizer's EOS, else its separator token."""
    sep = tok.eos_token_id if tok.eos_token_id is not None else getattr(tok, "sep_token_id", None)
    if sep is None:
        raise ValueError(
            f"mode='packed' joins documents with EOS, but tokenizer {tok.name_or_path!r} has neither an "
            "eos nor a sep token; use mode='first' or 'sequential'"
        )
    return sep


ORDER_BLOCK = 1 << 16  # documents shuffled together (docs/definitions.md#evaluation-windows)


def seeded_order(source: DocumentTokens, g: torch.Generator):
    """The documents' seeded visiting order, drawn lazily: a random permutation of each consecutive block of
    ORDER_BLOCK documents in turn, from the one generator (a corpus of at most ORDER_BLOCK documents: exactly
    ``torch.randperm(n, generator=g)``). A streamed corpus is read only as far as the blocks asked for."""
    start = 0
    while (n := source.available(start + ORDER_BLOCK) - start) > 0:
        yield from (start + torch.randperm(n, generator=g)).tolist()
        start += n


def _document_windows(source: DocumentTokens, mode: str, need: int, w: int, order, name: str, pack: bool = False):
    """Modes first and sequential (and auto, which is sequential here): round r takes the r-th non-overlapping window
    of every document long enough to hold it, documents in the seeded ``order``; mode 'first' stops after round 0 (one
    window per document).

    Documents are tokenized in that order only as far as the windows need: round 0 reads the first w tokens of
    documents until ``need`` of them hold a window; only when the whole corpus holds fewer are later rounds counted
    (every document's length, capped at need windows) and the windows read from the documents they fall in.

    With ``pack`` (mode auto, a tokenizer that can join documents), None as soon as the documents of the first block of
    the order (the first ORDER_BLOCK documents, or all of a smaller corpus) have been read and none holds a window: the
    caller packs them instead, and the rest of the corpus is never read."""
    long_enough, order, step, seen = [], iter(order), need + need // 8 + 2, 0  # a few spare: short documents
    first_block = source.available(ORDER_BLOCK) if pack else 0
    while len(long_enough) < need and (
        batch := list(itertools.islice(order, min(step, first_block - seen) if seen < first_block else step))
    ):  # (with pack, no batch reaches past the first block: the next block is not parsed until it is needed)
        heads = source.prefixes(batch, w)
        long_enough += [(i, heads[i]) for i in batch if len(heads[i]) >= w]
        seen += len(batch)
        if pack and not long_enough and seen >= first_block:
            return None
        # too few long enough so far: larger batches (the same windows, fewer tokenizer calls)
        step = min(2 * step, max(need, 4096))
    if len(long_enough) >= need:
        first = long_enough[:need]
        return torch.stack([t for _, t in first]), torch.tensor([i for i, _ in first])
    picks = [(i, 0) for i, _ in long_enough]
    if mode == "sequential" and long_enough:
        lengths = {i: len(t) for i, t in source.prefixes([i for i, _ in long_enough], need * w).items()}
        rounds = max(n // w for n in lengths.values())
        picks = [(i, r) for r in range(rounds) for i, _ in long_enough if lengths[i] >= (r + 1) * w]
    if len(picks) < need:
        what = "documents with at least" if mode == "first" else "non-overlapping windows of"
        others = "mode='sequential' or 'random'" if mode == "first" else "mode='random'"
        raise ValueError(
            f"corpus {name!r} has {len(picks)} {what} {w} text tokens, so mode={mode!r} can supply "
            f"{len(picks)} windows, not n_batches*batch_size={need}; ask for fewer windows, a smaller "
            f"ctx, or {others}"
        )
    picks = picks[:need]
    last = {}
    for i, r in picks:
        last[i] = max(last.get(i, 0), r + 1)
    docs = {i: source.prefixes([i], last[i] * w)[i] for i in sorted(last)}  # fewer than need documents
    return torch.stack([docs[i][r * w : (r + 1) * w] for i, r in picks]), torch.tensor([i for i, _ in picks])


def _random_windows_streamed(source: DocumentTokens, need: int, text_ctx: int, seed: int, eos: int, name: str):
    """Mode random on a streamed corpus: the windows :class:`WindowSampler` draws from the EOS-joined stream (the same
    starts, the same tokens), with the stream never held: one pass counts every document's tokens, piece by piece;
    a second tokenizes only the documents the windows fall in, keeping only the windows' tokens."""
    lengths = torch.tensor(
        [sum(len(x) for x in piece_ids(source.tok, source.documents.pieces(i))) for i in range(len(source))]
    )
    spans = lengths + (torch.arange(len(lengths)) < len(lengths) - 1).long()  # a document and the EOS after it
    doc_starts = torch.cumsum(spans, 0) - spans
    n_tokens, w = int(spans.sum()), text_ctx + 1
    if n_tokens < w:
        raise ValueError(
            f"corpus {name!r} holds {n_tokens} tokens (EOS separators included), fewer than one "
            f"window of {w} text tokens; mode='random' can supply no windows"
        )
    starts = torch.randint(0, n_tokens - text_ctx, (need,), generator=torch.Generator().manual_seed(seed))
    tokens = torch.empty(need, w, dtype=torch.long)
    wanted: dict[int, list[tuple[int, int, int]]] = {}  # document -> (window, its first local position, its end)
    for k, s in enumerate(starts.tolist()):
        d = int(torch.searchsorted(doc_starts, s, right=True)) - 1
        while d < len(spans) and doc_starts[d] < s + w:
            wanted.setdefault(d, []).append((k, s - int(doc_starts[d]), s + w - int(doc_starts[d])))
            d += 1
    for d in sorted(wanted):
        at, end = 0, max(hi for _, _, hi in wanted[d])
        pieces = piece_ids(source.tok, source.documents.pieces(d))
        for x in itertools.chain(pieces, [[eos]] if d < len(spans) - 1 else []):  # EOS: to the next document
            x = torch.tensor(x, dtype=torch.long)
            for k, lo, hi in wanted[d]:  # window k holds stream positions lo..hi of this document (local)
                a, b = max(lo, at), min(hi, at + len(x))
                if a < b:
                    tokens[k, a - lo : b - lo] = x[a - at : b - at]
            at += len(x)
            if at >= end:
                break
    return tokens, torch.searchsorted(doc_starts, starts, right=True) - 1


def _packed_windows(source: DocumentTokens, need: int, w: int, sep: int, name: str, auto: bool = False):
    """Mode packed (docs/definitions.md#evaluation-windows): the documents in corpus order joined by ``sep`` (EOS),
    cut into consecutive non-overlapping windows of w tokens from the start, as pretraining packs text; each window
    carries the document of its first token. Only the first need x w tokens of the stream are tokenized."""
    total, parts, owner, i = need * w, [], [], 0
    have = 0
    while have < total and source.available(i + 1) > i:
        if i:
            parts.append(torch.tensor([sep]))
            owner.append(torch.tensor([i - 1]))
            have += 1
        doc = source.prefixes([i], total - have)[i]
        parts.append(doc)
        owner.append(torch.full((len(doc),), i))
        have += len(doc)
        i += 1
    if have < total:
        why = "mode='auto' packs its documents (none holds a window) and " if auto else ""
        raise ValueError(
            f"corpus {name!r} holds {have} tokens (EOS separators included), so {why}mode='packed' can supply "
            f"{have // w} windows of {w} text tokens, not n_batches*batch_size={need}; ask for fewer "
            "windows or a smaller ctx"
        )
    stream, docs = torch.cat(parts)[:total], torch.cat(owner)[:total]
    return stream.view(need, w), docs.view(need, w)[:, 0].clone()


def cap_ctx(ctx: int | None, n_ctx: int | None) -> int:
    """Evaluation context: ``None`` → min(model maximum, 1024) (docs/definitions.md#evaluation-windows); above the
    model's maximum is an error."""
    if ctx is None:
        return DEFAULT_MAX_EVAL_CTX if n_ctx is None else min(n_ctx, DEFAULT_MAX_EVAL_CTX)
    if ctx < 2:
        raise ValueError(f"ctx={ctx} must be at least 2")
    if n_ctx is not None and ctx > n_ctx:
        raise ValueError(f"ctx={ctx} exceeds the model's maximum context n_ctx={n_ctx}")
    return ctx
