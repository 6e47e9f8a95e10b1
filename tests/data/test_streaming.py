"""Streamed corpora (docs/definitions.md#streamed-corpora): a local file's documents are found in one pass and read
from disk only as far as the windows need, with exactly the documents and windows that a whole-file read gives; the
packed window mode; long documents tokenized in pieces."""

import gzip
import json
import random
import tracemalloc

import pytest
import torch

from probe.data import batches as B
from probe.data import streams as S
from probe.data.batches import eval_batches, tokenize_documents
from probe.data.corpus import CORPUS_DIR, Corpus, load_corpus
from probe.data.documents import split_blank_lines
from probe.data.windows import build_windows


@pytest.fixture(scope="module")
def tok():
    from probe.data.tokenizer import load_tokenizer

    return load_tokenizer()


def whole_jsonl(raw: bytes) -> tuple[list[str], int]:
    """The documents and bad-record count of a JSON-lines file read whole (the reader streaming replaced)."""
    docs, bad = [], 0
    for line in raw.decode().split("\n"):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if isinstance(record, dict) and isinstance(record.get("text"), str):
            docs += [record["text"]] if record["text"].strip() else []
        else:
            bad += 1
    return docs, bad


def test_text_files_split_as_a_whole_file_read_splits_them(tmp_path, monkeypatch):
    """Blocks of a few bytes put every separator, CRLF and multi-byte character across a block boundary somewhere."""
    rng = random.Random(0)
    parts = ["a", "b", " ", "\t", "\n", "\r", "\r\n", "é", "\u00a0", "x\n\n", "\n \n", "\n\t\n\n", "\u3000"]
    path = tmp_path / "t.txt"
    for _ in range(400):
        monkeypatch.setattr(S, "BLOCK", rng.choice([3, 7, 64]))
        path.write_bytes("".join(rng.choice(parts) for _ in range(rng.randint(0, 40))).encode())
        assert list(S.FileDocuments(path)) == split_blank_lines(path.read_text(encoding="utf-8"))


def test_a_text_file_without_line_ends_is_indexed_in_bounded_memory(tmp_path, monkeypatch):
    monkeypatch.setattr(S, "BLOCK", 4096)
    path = tmp_path / "one-line.txt"
    path.write_text("word " * 400_000)
    tracemalloc.start()
    docs = S.FileDocuments(path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(docs) == 1 and peak < 64 * S.BLOCK, peak  # the 2 MB line never sits in the buffer
    assert docs[0] == path.read_text()


def test_jsonl_records_read_as_streams_give_the_records_text(tmp_path, monkeypatch):
    """Long records (LONG_RECORD made small) are scanned and decoded in pieces: escapes, surrogate pairs, nested
    values, other keys before and after "text", bad records; plain and gzip."""
    rng = random.Random(1)
    chars = ["a", " ", "\n", "é", "😀", '"', "\\", "\u2028", "xxxxx", "\t"]

    def record():
        r, text = rng.random(), "".join(rng.choice(chars) for _ in range(rng.randint(0, 60)))
        bad = [
            json.dumps({"id": 1}),
            json.dumps({"text": 5}),
            "{not json",
            "",
            json.dumps({"text": [1, {"a": "}"}]}),
            json.dumps([1, 2]),
            json.dumps({"text": None}),
        ]
        if r < 0.25:
            return rng.choice(bad)
        obj = {"meta": {"k": [1, 2, 'x"y']}, "text": text} if r < 0.6 else {"text": text, "n": -1.5e3, "b": True}
        return json.dumps(obj, ensure_ascii=rng.random() < 0.5)

    for _ in range(150):
        monkeypatch.setattr(S, "BLOCK", rng.choice([3, 9, 64]))
        monkeypatch.setattr(S, "LONG_RECORD", rng.choice([4, 30, 1 << 20]))
        raw = "\n".join(record() for _ in range(rng.randint(2, 6))).encode() + b"\n"
        want, bad = whole_jsonl(raw)
        for name, data in (("t.jsonl", raw), ("t.jsonl.gz", gzip.compress(raw))):
            (tmp_path / name).write_bytes(data)
            if not want:
                with pytest.raises(ValueError, match="holds no records with text"):
                    S.FileDocuments(tmp_path / name, skip_bad=True)
                continue
            docs = S.FileDocuments(tmp_path / name, skip_bad=True)
            assert (list(docs), docs.skipped) == (want, bad)


def test_a_streamed_copy_of_a_bundled_text_gives_its_windows(tmp_path, tok):
    """The same documents from a file (streamed) and in memory give byte-identical windows in every mode, and the
    same tokens as tokenizing every document whole."""
    text = (CORPUS_DIR / "wikitext-2-test.txt").read_text(encoding="utf-8")
    path = tmp_path / "wiki.txt"
    path.write_text("\n\n".join(d.replace("\n\n", "\n") for d in split_blank_lines(text)[:40]), encoding="utf-8")
    streamed, held = load_corpus(path), Corpus("held", split_blank_lines(path.read_text(encoding="utf-8")))
    assert list(streamed.documents) == held.documents
    whole = tokenize_documents(held, tok)
    for mode, ctx, n in (("first", 64, 4), ("sequential", 64, 16), ("random", 64, 4), ("packed", 128, 6)):
        a = eval_batches(streamed, tok, n_batches=n, batch_size=4, ctx=ctx, mode=mode, seed=3)
        b = eval_batches(held, tok, n_batches=n, batch_size=4, ctx=ctx, mode=mode, seed=3)
        c = eval_batches(whole, tok, n_batches=n, batch_size=4, ctx=ctx, mode=mode, seed=3)
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.tokens, c.tokens), mode
        assert torch.equal(a.doc_ids, b.doc_ids) and torch.equal(a.doc_ids, c.doc_ids), mode


def test_random_windows_of_long_streamed_documents_are_the_samplers(tmp_path, tok, monkeypatch):
    """Mode random on a streamed file draws the WindowSampler's starts over the whole EOS-joined stream and cuts
    the same windows (across document ends too), tokenizing documents piece by piece instead of holding the stream."""
    monkeypatch.setattr(B, "PIECE_CHARS", 1500)
    docs = ["\n".join(d.split("\n")[:12]) for d in load_corpus("kjv").documents[:12]] + ["A short one.", "Two."]
    path = tmp_path / "long.txt"
    path.write_text("\n\n".join(d.replace("\n\n", "\n") for d in docs))
    streamed = load_corpus(path)
    held = Corpus("held", list(streamed.documents))
    assert max(len(d) for d in held.documents) > 3 * B.PIECE_CHARS
    a = eval_batches(streamed, tok, n_batches=4, batch_size=8, ctx=200, mode="random", seed=5)
    b = eval_batches(held, tok, n_batches=4, batch_size=8, ctx=200, mode="random", seed=5)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.doc_ids, b.doc_ids)
    assert (a.tokens == tok.eos_token_id).any()  # some window crosses a document boundary


def test_windows_of_a_large_document_read_only_what_they_need(tmp_path, tok, monkeypatch):
    """A 24 MB single-record .jsonl.gz and a 24 MB one-document .txt: the tokenizer sees at most a piece of text
    per window's document and Python holds at most a few blocks at a time (tracemalloc's peak), never the file."""
    line = "The quick brown fox jumps over the lazy dog, again and again.\n"
    text = line * (24_000_000 // len(line))
    (tmp_path / "one.jsonl.gz").write_bytes(gzip.compress((json.dumps({"text": text}) + "\n").encode(), 1))
    (tmp_path / "one.txt").write_text(text)
    del text
    seen = []
    real = B._encode
    monkeypatch.setattr(B, "_encode", lambda t, s: seen.append(len(s)) or real(t, s))
    for name in ("one.jsonl.gz", "one.txt"):
        seen.clear()
        tracemalloc.start()
        eb = build_windows(tmp_path / name, tok, n_batches=2, batch_size=4, ctx=64, mode="auto")
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert eb.tokens.shape == (2, 4, 65) and eb.mode == "sequential" and eb.doc_ids.unique().tolist() == [0]
        assert sum(seen) <= 4 * B.PIECE_CHARS, name  # mode first, then round 0, the length count, the windows
        assert peak < 5 * S.LONG_RECORD, f"{name}: Python peak {peak / 2**20:.0f} MiB"
        assert eb.corpus_fingerprint == load_corpus(tmp_path / name).content["sha256"][:16]


def test_long_documents_are_tokenized_in_pieces_cut_at_line_ends(tok, monkeypatch):
    """A document longer than PIECE_CHARS is cut after a line break (else before a space): for byte-level BPE on
    text with line breaks this gives the tokens of the whole document, and a prefix reads only its pieces."""
    monkeypatch.setattr(B, "PIECE_CHARS", 2000)
    doc = "\n".join(load_corpus("kjv").documents[0].split("\n")[:200])
    assert len(doc) > 20 * B.PIECE_CHARS
    whole = torch.tensor(tok(doc, add_special_tokens=False)["input_ids"])
    pieces = [doc[i : i + 777] for i in range(0, len(doc), 777)]  # any split of the text gives the same cuts
    assert torch.equal(B.tokenize_pieces(tok, iter(pieces)), whole)
    assert torch.equal(B.tokenize_pieces(tok, iter(pieces), limit=100), whole[:100])
    assert B._cut("a" * 3000) == 2000 and B._cut("a " * 1500) == 1999 and B._cut("ab\n" * 1000) == 1998


def test_packed_windows_are_the_eos_joined_stream_cut_in_order(tok):
    kjv = load_corpus("kjv")
    docs = tokenize_documents(kjv, tok)
    eos = tok.eos_token_id
    stream = torch.cat([torch.cat([d, torch.tensor([eos])]) for d in docs])[:-1]
    eb = build_windows(kjv, tok, n_batches=2, batch_size=3, ctx=32768, mode="packed")
    assert eb.tokens.shape == (2, 3, 32769) and eb.to_dict()["mode"] == "packed"
    assert torch.equal(eb.tokens.flatten(), stream[: 6 * 32769])
    starts = torch.cumsum(torch.tensor([len(d) + 1 for d in docs]), 0)
    first_token_doc = torch.searchsorted(starts, torch.arange(6) * 32769, right=True)
    assert torch.equal(eb.doc_ids.flatten(), first_token_doc)
    with_bos = build_windows(kjv, tok, n_batches=1, batch_size=2, ctx=100, mode="packed", bos_id=7)
    assert (with_bos.tokens[..., 0] == 7).all() and torch.equal(with_bos.tokens[0, 0, 1:], stream[:100])
    with pytest.raises(ValueError, match=r"mode='packed' can supply \d+ windows"):
        build_windows("wikitext-2-test", tok, n_batches=100, batch_size=8, ctx=1024, mode="packed")


def test_packed_is_a_window_mode_of_the_command_line():
    from probe.cli.main import build_parser

    args = build_parser().parse_args(["sinks", "--window-mode", "packed"])
    assert args.window_mode == "packed"


def test_a_streamed_training_corpus_gives_the_samplers_windows_and_resume(tmp_path, tok):
    """probe train on a local file: the token stream lives in a temporary file (2 bytes a token, unlinked at once)
    and the sampler draws exactly the windows, and resumes exactly where, the in-memory sampler does."""
    from probe.data.batches import WindowSampler, token_stream
    from probe.data.corpus import split_heldout

    path = tmp_path / "corpus.txt"
    path.write_text("\n\n".join(load_corpus("wikitext-2-test").documents[:12]))
    streamed_keep, streamed_held = split_heldout(load_corpus(path))
    keep, held = split_heldout(Corpus("held", list(load_corpus(path).documents)))
    assert list(streamed_held.documents) == held.documents and streamed_keep.content == keep.content
    stream = token_stream(streamed_keep.documents, tok, tok.eos_token_id, tmp_path)
    assert stream[0].dtype == torch.uint16 and not [p for p in tmp_path.iterdir() if p.name.startswith(".probe")]
    a = WindowSampler(None, 64, seed=2, eos_id=tok.eos_token_id, stream=stream)
    b = WindowSampler(tokenize_documents(keep, tok), 64, seed=2, eos_id=tok.eos_token_id)
    assert torch.equal(a.doc_starts, b.doc_starts) and torch.equal(a.sample(8), b.sample(8))
    state = a.state_dict()
    assert state["n_tokens"] == b.state_dict()["n_tokens"]
    after = a.sample(8)
    c = WindowSampler(None, 64, seed=0, eos_id=tok.eos_token_id, stream=stream)
    c.load_state_dict(state)
    assert torch.equal(c.sample(8), after) and torch.equal(b.sample(8), after)


def _many_records(path, n: int, bad_at: int | None = None) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            f.write(
                '{"text": 5}\n' if i == bad_at else json.dumps({"text": f"record {i} of the quick brown fox"}) + "\n"
            )


def test_a_few_windows_of_many_tiny_records_parse_few_records(tmp_path, tok, monkeypatch):
    """A .jsonl of millions of tiny records ran 400-600 s and up to 5.7 GB for a few windows: parsing and tokenizing
    grew with the records. Now they stop when the windows are full; only the fingerprint reads every byte."""
    path = tmp_path / "many.jsonl"
    _many_records(path, 100_000, bad_at=90_000)  # a bad record past what the windows read is never reached
    parsed, real = [], S._record_text
    monkeypatch.setattr(S, "_record_text", lambda line: parsed.append(1) or real(line))
    eb = build_windows(path, tok, n_batches=1, batch_size=2, ctx=64, mode="packed")
    assert eb.tokens.shape == (1, 2, 65) and len(parsed) < 100
    assert eb.corpus_fingerprint == __import__("hashlib").sha256(path.read_bytes()).hexdigest()[:16]
    parsed.clear()
    eb = build_windows(path, tok, n_batches=1, batch_size=2, ctx=4, mode="auto")  # first, from the first block
    assert eb.mode == "first" and len(parsed) <= B.ORDER_BLOCK + 64  # the block's records, then the texts read
    with pytest.raises(ValueError, match=r"many.jsonl:90001 has a \"text\" of type int"):
        build_windows(path, tok, n_batches=1, batch_size=2, ctx=4, mode="random")  # random reads every record
    with pytest.raises(ValueError, match=r"many.jsonl:90001"):  # and the error stays
        list(load_corpus(path).documents)[-1:]


def test_the_seeded_order_is_randperm_within_blocks(monkeypatch):
    monkeypatch.setattr(B, "ORDER_BLOCK", 4)
    docs = B.DocumentTokens([torch.zeros(1)] * 10)
    g, h = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    want = [*torch.randperm(4, generator=h).tolist()]
    want += [4 + i for i in torch.randperm(4, generator=h).tolist()] + [8 + i for i in torch.randperm(2, generator=h)]
    assert list(B.seeded_order(docs, g)) == [int(i) for i in want]
    monkeypatch.setattr(B, "ORDER_BLOCK", 1 << 16)  # a corpus of at most one block: randperm of all, as always
    assert (
        list(B.seeded_order(docs, torch.Generator().manual_seed(3)))
        == torch.randperm(10, generator=torch.Generator().manual_seed(3)).tolist()
    )


def test_auto_is_first_or_sequential_from_one_pass(tok):
    docs = [" ".join(f"w{i}" for i in range(400))] * 3 + ["short"]
    for n, mode in ((3, "first"), (6, "sequential")):
        eb = build_windows(docs, tok, n_batches=1, batch_size=n, ctx=16, mode="auto")
        assert eb.mode == mode
        assert torch.equal(eb.tokens, build_windows(docs, tok, n_batches=1, batch_size=n, ctx=16, mode=mode).tokens)
