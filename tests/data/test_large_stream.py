"""A .jsonl.gz corpus of a million one-token records (docs/definitions.md#streamed-corpora): two windows read only
what they need, and documents visited in the seeded order (shuffled within blocks of 65,536) are sliced from the
recently inflated chunks instead of inflating the file again from its start at every backward seek (a million
records in auto mode ran over 90 s, nearly all of it re-inflating the file). Counted, not timed."""

import gzip
import hashlib
import json
import random

import pytest

from probe.data import streams as S
from probe.data.windows import build_windows

N = 1_000_000
RECORD = b'{"text": "a"}\n'


@pytest.fixture(scope="module")
def tok():
    from probe.data.tokenizer import load_tokenizer

    return load_tokenizer()


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    path = tmp_path_factory.mktemp("large") / "one-token.jsonl.gz"
    path.write_bytes(gzip.compress(RECORD * N, compresslevel=1))  # a million records in a fraction of a second
    return path


@pytest.fixture
def inflated(monkeypatch):
    """Bytes read out of every gzip stream (the parse and the seeking handle; a backward seek reads again)."""
    counts = {"bytes": 0, "seeks": 0}
    read, seek = gzip.GzipFile.read, gzip.GzipFile.seek

    def counted_read(self, size=-1):
        data = read(self, size)
        counts["bytes"] += len(data)
        return data

    def counted_seek(self, offset, whence=0):
        counts["seeks"] += 1
        return seek(self, offset, whence)

    monkeypatch.setattr(gzip.GzipFile, "read", counted_read)
    monkeypatch.setattr(gzip.GzipFile, "seek", counted_seek)
    return counts


def test_two_packed_windows_parse_a_few_records_of_a_million(big, tok, monkeypatch, inflated):
    parsed, real = [], S._record_text
    monkeypatch.setattr(S, "_record_text", lambda line: parsed.append(1) or real(line))
    eb = build_windows(big, tok, n_batches=1, batch_size=2, ctx=64, mode="packed")
    assert eb.tokens.shape == (1, 2, 65)
    assert len(parsed) < 1000  # 130 tokens (one a record, one an EOS): the first ~65 records and their texts
    assert inflated["bytes"] <= 2 * S.BLOCK  # the parse's first block, nothing more
    # the fingerprint still hashes every byte of the file as stored (at C speed, in BLOCK-sized reads)
    assert eb.corpus_fingerprint == hashlib.sha256(big.read_bytes()).hexdigest()[:16]


def test_documents_in_the_seeded_order_inflate_the_file_once(big, inflated):
    """Two blocks of 65,536 documents read as the window builder reads them: each block parsed, then its documents in
    a shuffled order, 64 at a time in ascending order. Without the recent chunks every batch of 64 rewound the gzip
    stream and inflated it again up to its largest document."""
    docs, rng, block = S.FileDocuments(big), random.Random(0), 1 << 16
    for start in (0, block):
        assert docs.available(start + block) == start + block
        order = list(range(start, start + block))
        rng.shuffle(order)
        for b in range(0, block, 64):
            assert all("".join(docs.pieces(i)) == "a" for i in sorted(order[b : b + 64]))
    parsed_bytes = 2 * block * len(RECORD)
    assert inflated["bytes"] <= parsed_bytes + 2 * S.BLOCK  # inflated once, by the parse; every text from its chunks
    assert inflated["seeks"] == 0


def test_texts_read_through_a_small_chunk_cache_are_the_records(tmp_path, monkeypatch):
    """Chunks of a few bytes, a cache of a few chunks: records span chunks, misses read behind and ahead of the
    handle, evictions happen all the time; every document is still its record's text."""
    monkeypatch.setattr(S, "BLOCK", 16)
    monkeypatch.setattr(S, "RECENT", 48)
    rng = random.Random(1)
    texts = ["".join(rng.choice("ab é\u3000x") for _ in range(rng.randint(1, 40))) for _ in range(600)]
    lines = [json.dumps({"id": i, "text": t}, ensure_ascii=rng.random() < 0.5) for i, t in enumerate(texts)]
    path = tmp_path / "varied.jsonl.gz"
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    want = [t for t in texts if t.strip()]
    docs = S.FileDocuments(path)
    order = list(range(len(want)))
    rng.shuffle(order)
    assert ["".join(docs.pieces(i)) for i in order] == [want[i] for i in order]
    assert list(docs) == want
    assert docs._recent.size <= 48 + 16
