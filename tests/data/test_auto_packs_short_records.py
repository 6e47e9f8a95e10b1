"""Mode auto on a corpus whose documents are all shorter than a window (docs/definitions.md#evaluation-windows): the
first block of the seeded order (65,536 documents) decides, so the documents are packed after reading that block and
the windows' records, never the rest of the file. Counted, not timed."""

import gzip

import pytest
import torch

from probe.data import batches as B
from probe.data import streams as S
from probe.data.windows import build_windows

N = 200_000
RECORD = b'{"text": "a"}\n'


@pytest.fixture(scope="module")
def tok():
    from probe.data.tokenizer import load_tokenizer

    return load_tokenizer()


@pytest.fixture(scope="module")
def short_records(tmp_path_factory):
    """N one-token records, the gzip stream cut off after about three quarters of them: reading the whole file fails."""
    path = tmp_path_factory.mktemp("short") / "one-token.jsonl.gz"
    whole = gzip.compress(RECORD * N, compresslevel=1)
    path.write_bytes(whole[: len(whole) * 3 // 4])
    return path


def test_auto_packs_from_the_first_block_without_reading_the_rest(short_records, tok, monkeypatch):
    parsed, real = [], S._record_text
    monkeypatch.setattr(S, "_record_text", lambda line: parsed.append(1) or real(line))
    eb = build_windows(short_records, tok, n_batches=1, batch_size=2, ctx=64, mode="auto")
    assert eb.mode == "packed" and eb.tokens.shape == (1, 2, 65)
    # the first block parsed and its texts read (two calls a record), then the few records the windows hold
    assert len(parsed) <= 2 * B.ORDER_BLOCK + 200 < N
    packed = build_windows(short_records, tok, n_batches=1, batch_size=2, ctx=64, mode="packed")
    assert torch.equal(eb.tokens, packed.tokens) and torch.equal(eb.doc_ids, packed.doc_ids)
    with pytest.raises(ValueError, match="corrupt or truncated"):  # reading every record reaches the cut
        len(S.FileDocuments(short_records))


def test_auto_packs_a_small_corpus_of_short_documents_and_keeps_its_other_choices(tok):
    short = [f"word {i}" for i in range(300)]
    for bos in (None, tok.eos_token_id):
        eb = build_windows(short, tok, n_batches=2, batch_size=2, ctx=16, mode="auto", bos_id=bos)
        want = build_windows(short, tok, n_batches=2, batch_size=2, ctx=16, mode="packed", bos_id=bos)
        assert eb.mode == "packed" and torch.equal(eb.tokens, want.tokens)
    with pytest.raises(ValueError, match=r"mode='auto' packs its documents .* mode='packed' can supply \d+ windows"):
        build_windows(short[:3], tok, n_batches=2, batch_size=2, ctx=16, mode="auto")
    # one document long enough for a window: first / sequential as before, never packed
    one_long = [" ".join(f"w{i}" for i in range(400))] + short
    eb = build_windows(one_long, tok, n_batches=1, batch_size=3, ctx=16, mode="auto")
    want = build_windows(one_long, tok, n_batches=1, batch_size=3, ctx=16, mode="sequential")
    assert eb.mode == "sequential" and torch.equal(eb.tokens, want.tokens)
    with pytest.raises(ValueError, match="non-overlapping windows"):
        build_windows(one_long, tok, n_batches=100, batch_size=8, ctx=16, mode="auto")


def test_a_long_document_after_the_first_block_is_not_reached_by_auto(tok, monkeypatch):
    """The rule is the first block's: documents past it are read only when the first block holds a window."""
    monkeypatch.setattr(B, "ORDER_BLOCK", 8)
    docs = [f"w{i}" for i in range(8)] + [" ".join(f"w{i}" for i in range(400))]
    assert build_windows(docs, tok, n_batches=1, batch_size=2, ctx=16, mode="auto").mode == "packed"
    assert build_windows(docs, tok, n_batches=1, batch_size=2, ctx=16, mode="sequential").mode == "sequential"
