"""Named text corpora: bundled offline texts, local files, and (online only) Hugging Face datasets.

Every analysis records which text it ran on, so a corpus carries a ``name`` (its identity in outputs) and a
``fingerprint`` (hash of its documents) besides the documents themselves. How each text is cut into documents is
described in ``probe.data.documents``.

    load_corpus("wikitext-2-test")          # default evaluation corpus (bundled)
    load_corpus("train")                    # bundled training mix: shakespeare + kjv + wikitext-2-valid
    load_corpus("my_texts/")                # one document per .txt file (recursive, sorted)
    load_corpus("notes.txt")                # one document per blank-line-separated chunk
    load_corpus("shard.jsonl.gz")           # one document per line's "text" field (e.g. a FineWeb-Edu dump), gzip ok
    load_corpus("hf:wikitext-2-raw-v1:test")  # through `datasets`; needs the hub (or HF_HUB_OFFLINE=1 and a cache)
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import socket
import threading
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from probe.data import documents as D
from probe.data.streams import FileDocuments
from probe.writes import atomic_write, clean_text

CORPUS_DIR = Path(__file__).parent / "corpora"
DEFAULT_EVAL_CORPUS = "wikitext-2-test"

CORPORA = {
    "wikitext-2-valid": "WikiText-2 validation split (tokenised release, <unk> and @-@ kept), one document per article",
    "wikitext-2-test": "WikiText-2 test split (tokenised release), one document per article; default evaluation corpus",
    "shakespeare": "Shakespeare's plays and poems (Project Gutenberg), one document per work",
    "kjv": "King James Bible, one document per book",
    "train": "bundled training mix: shakespeare + kjv + wikitext-2-valid",
    "hf:wikitext-2-raw-v1:<split>": "WikiText-2 raw (untokenised) through `datasets`, one document per article; online",
    "hf:fineweb-edu[:<n_docs>]": "FineWeb-Edu sample-10BT, first n_docs records (default 10000), streamed; online",
}

_BUNDLED = {  # name -> (file, splitter)
    "wikitext-2-valid": ("wikitext-2-valid.txt", D.split_wikitext),
    "wikitext-2-test": ("wikitext-2-test.txt", D.split_wikitext),
    "shakespeare": ("shakespeare.txt", D.split_shakespeare),
    "kjv": ("kjv.txt", D.split_kjv),
}
TRAIN_MIX = ("shakespeare", "kjv", "wikitext-2-valid")
# the run's policy for JSON-lines records without a string "text": False = stop at the first (one line naming it),
# True = skip them with a warning that counts them (the CLI's --skip-bad-records sets it around a verb's run)
SKIP_BAD_RECORDS: ContextVar[bool] = ContextVar("SKIP_BAD_RECORDS", default=False)


@dataclass
class Corpus:
    name: str  # identity recorded in every output
    documents: Sequence[str] = field(repr=False)  # a list, or a local file's FileDocuments (read when asked for)
    source: str = ""  # where the text came from, in words

    @cached_property
    def fingerprint(self) -> str:
        """First 16 hex digits of the SHA-256 of the documents (order and boundaries included); of a local file or
        directory, of its bytes (``content``), so that a streamed corpus is never decoded whole to name it."""
        return self.content["sha256"][:16]

    @cached_property
    def content(self) -> dict:
        """What resume compares (docs/definitions.md#streamed-corpora): ``sha256`` (hex) and ``bytes`` of a local
        file or directory as stored; of an in-memory corpus, of its documents each followed by a NUL byte."""
        if isinstance(self.documents, FileDocuments):
            return {"sha256": self.documents.sha256, "bytes": self.documents.size}
        h, size, docs = hashlib.sha256(), 0, self.documents
        for i in range(len(docs)):  # a view of a streamed corpus is hashed piece by piece
            for piece in docs.pieces(i) if hasattr(docs, "pieces") else (docs[i],):
                data = clean_text(piece).encode("utf-8")
                h.update(data)
                size += len(data)
            h.update(b"\x00")
            size += 1
        return {"sha256": h.hexdigest(), "bytes": size}

    def __len__(self) -> int:
        return len(self.documents)

    def to_dict(self) -> dict:
        return {
            "corpus": self.name,
            "corpus_fingerprint": self.fingerprint,
            "corpus_source": self.source,
            "corpus_documents": len(self.documents),
        }


def load_corpus(
    name_or_path: str | os.PathLike = DEFAULT_EVAL_CORPUS, *, skip_bad_records: bool | None = None
) -> Corpus:
    """A bundled name, ``train``, a local ``.txt`` file or directory, or ``hf:...``; see ``CORPORA``.

    Every local file read is a regular file of bounded size (``probe.data.limits.check_input_file``). A JSON-lines
    record without a string ``"text"`` is a ``ValueError`` naming the file and line, or with ``skip_bad_records``
    (None: ``SKIP_BAD_RECORDS`` of the caller's context, the CLI's ``--skip-bad-records``) skipped with a warning that
    counts them."""
    key = str(name_or_path)
    if key in _BUNDLED:
        fname, split = _BUNDLED[key]
        text = (CORPUS_DIR / fname).read_text(encoding="utf-8")
        return Corpus(key, split(text), f"bundled {fname} ({CORPORA[key]})")
    if key == "train":
        parts = [load_corpus(n) for n in TRAIN_MIX]
        return Corpus("train", [d for p in parts for d in p.documents], "bundled mix: " + " + ".join(TRAIN_MIX))
    if key.startswith("hf:"):
        return _load_hf(key)
    path = Path(key).expanduser()
    if path.exists():  # streamed: the documents stay in the file until a window reads them
        skip = SKIP_BAD_RECORDS.get() if skip_bad_records is None else skip_bad_records
        docs = FileDocuments(path, skip_bad=skip)  # a bad record is named (or skipped, with a warning) when read
        how = {
            "directory": f"directory, one document per .txt file ({getattr(docs, 'n_files', 0)} files)",
            "text": "text file, one document per blank-line-separated chunk",
        }.get(docs.format, 'JSON lines, one document per record\'s "text"')
        note = (
            '; records without a string "text" skipped (--skip-bad-records)'
            if skip and docs.format.startswith("jsonl")
            else ""
        )
        return Corpus(clean_text(str(path.resolve())), docs, how + note)  # a name shown and recorded: valid text
    if key.endswith((".txt", ".jsonl", ".jsonl.gz")) or os.sep in key:
        raise FileNotFoundError(f"corpus file {key!r} does not exist")
    raise ValueError(
        f"unknown corpus {key!r}; choose one of {sorted(_BUNDLED) + ['train']}, a .txt or "
        ".jsonl[.gz] file, a directory of .txt files, or hf:wikitext-2-raw-v1:<split> / "
        "hf:fineweb-edu[:<n_docs>]"
    )


HELDOUT = "heldout"  # `probe train --eval-data heldout`: validate on documents of the training corpus never trained on
HELDOUT_FRACTION = 0.05


def split_heldout(corpus: Corpus, fraction: float = HELDOUT_FRACTION) -> tuple[Corpus, Corpus]:
    """(training documents, held-out documents) of one corpus: the ``fraction`` of documents (at least one) with the
    smallest SHA-256 of their text. Deterministic and independent of the seed and of document order, so paired runs
    and resumed runs hold out the same documents; the sampler never sees them."""
    if len(corpus.documents) < 2:
        raise ValueError(
            f"corpus {corpus.name!r} has {len(corpus.documents)} document(s); a held-out split needs at "
            "least 2; pass another corpus for validation"
        )
    n_out = min(len(corpus.documents) - 1, max(1, round(fraction * len(corpus.documents))))
    digest = [_document_sha256(corpus.documents, i) for i in range(len(corpus.documents))]
    out = set(sorted(range(len(digest)), key=lambda i: (digest[i], i))[:n_out])
    keep_ids = [i for i in range(len(digest)) if i not in out]
    held_ids = [i for i in range(len(digest)) if i in out]
    if isinstance(corpus.documents, list):
        keep, held = [corpus.documents[i] for i in keep_ids], [corpus.documents[i] for i in held_ids]
    else:  # a streamed corpus stays on disk: the two parts are views of its documents
        keep, held = DocumentSubset(corpus.documents, keep_ids), DocumentSubset(corpus.documents, held_ids)
    return (
        Corpus(corpus.name, keep, f"{corpus.source}; {len(held)} held-out documents removed"),
        Corpus(
            f"{corpus.name}:{HELDOUT}",
            held,
            f"held-out {len(held)} of {len(corpus.documents)} documents of "
            f"{corpus.name} (smallest SHA-256), never sampled for training",
        ),
    )


def _document_sha256(documents, i: int) -> bytes:
    """SHA-256 of one document's UTF-8 text (a streamed document hashed piece by piece)."""
    h = hashlib.sha256()
    for piece in documents.pieces(i) if hasattr(documents, "pieces") else (documents[i],):
        h.update(clean_text(piece).encode("utf-8"))
    return h.hexdigest()


class DocumentSubset(Sequence):
    """Some documents of a streamed corpus, by index, still read from its file (``pieces`` as FileDocuments)."""

    def __init__(self, documents, indices):
        self.base, self.indices = documents, list(indices)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return self.base[self.indices[i]]

    def pieces(self, i: int):
        return self.base.pieces(self.indices[i])


def write_jsonl(documents, path: str | os.PathLike) -> Path:
    """Save documents as a gzip JSON-lines corpus that ``load_corpus`` reads back unchanged (written atomically)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = b"".join((json.dumps({"text": clean_text(d)}) + "\n").encode("utf-8") for d in documents)
    atomic_write(path, gzip.compress(lines))
    return path


def _hub_reachable(host: str = "huggingface.co", timeout: float = 3.0) -> bool:
    """DNS lookup with a timeout, so that an offline machine fails in seconds instead of retrying for half a minute."""
    ok = []
    t = threading.Thread(target=lambda: ok.append(_resolves(host)), daemon=True)
    t.start()
    t.join(timeout)
    return bool(ok and ok[0])


def _resolves(host: str) -> bool:
    try:
        socket.getaddrinfo(host, 443)
        return True
    except OSError:
        return False


def _load_hf(key: str) -> Corpus:
    parts = key.split(":")
    if parts[1] == "wikitext-2-raw-v1" and len(parts) == 3 and parts[2] in ("train", "validation", "test"):
        args, kwargs, n_docs = ("wikitext", "wikitext-2-raw-v1"), {"split": parts[2]}, None
    elif parts[1] == "fineweb-edu" and len(parts) <= 3:
        if len(parts) == 3 and not parts[2].isdigit():
            raise ValueError(
                f"bad document count {parts[2]!r} in {key!r}; use hf:fineweb-edu:<n_docs>, e.g. hf:fineweb-edu:2000"
            )
        n_docs = int(parts[2]) if len(parts) == 3 else 10000
        args, kwargs = ("HuggingFaceFW/fineweb-edu",), {"name": "sample-10BT", "split": "train", "streaming": True}
    else:
        raise ValueError(
            f"unknown online corpus {key!r}; choose hf:wikitext-2-raw-v1:{{train,validation,test}} "
            "or hf:fineweb-edu[:<n_docs>]"
        )
    offline_env = os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1"
    if not offline_env and not _hub_reachable():
        raise ConnectionError(
            f"corpus {key!r} needs the Hugging Face hub, which is unreachable; offline use the "
            f"bundled 'wikitext-2-test' / 'train' (or set HF_HUB_OFFLINE=1 to read a local cache)"
        )
    try:
        import datasets
    except ImportError as e:
        raise ImportError(f"corpus {key!r} needs the `datasets` package (pip install datasets)") from e
    try:
        ds = datasets.load_dataset(*args, **kwargs)
        if n_docs is None:
            docs = D.split_wikitext("\n".join(t.rstrip("\n") for t in ds["text"]))
        else:
            docs = [clean_text(r["text"]) for _, r in zip(range(n_docs), ds)]
    except Exception as e:  # hub errors arrive as many types; report one line
        raise ConnectionError(
            f"could not load corpus {key!r} through `datasets`: {type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}"
        ) from e
    return Corpus(key, docs, f"Hugging Face datasets {args[0]} {kwargs}")
