"""The text rule (docs/definitions.md#text-decoding): bytes that are not UTF-8 and lone surrogates become U+FFFD in
every text probe reads (corpus files, lists of texts, --text, names recorded in results); deep JSON is a bad record
named in one line."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from probe.data.corpus import load_corpus
from probe.data.windows import build_windows
from probe.writes import clean_text
from tests.support.cli import WINDOWS, assert_one_line_error

LONG = "words enough for a window of sixteen tokens and then a few more words " * 3


@pytest.fixture(scope="module")
def tok():
    from probe.data.tokenizer import load_tokenizer

    return load_tokenizer()


def test_clean_text_replaces_lone_surrogates_only():
    assert clean_text("plain é 😀") == "plain é 😀"
    assert clean_text("a\udcffb\ud800") == "a\ufffdb\ufffd"


def test_a_jsonl_record_with_a_lone_surrogate_escape_is_tokenized_with_u_fffd(tmp_path, tok):
    """It was a TypeError from the tokenizer."""
    path = tmp_path / "s.jsonl"
    lines = [
        json.dumps({"text": LONG}),
        '{"text": "bad \\udcff and \\ud83d alone ' + LONG + '"}',
        json.dumps({"text": LONG}),
    ]
    path.write_text("\n".join(lines) + "\n")
    docs = list(load_corpus(path).documents)
    assert docs[1].startswith("bad \ufffd and \ufffd alone")
    eb = build_windows(path, tok, n_batches=1, batch_size=3, ctx=16, mode="first")
    assert eb.tokens.shape == (1, 3, 17)


def test_bytes_that_are_not_utf8_become_u_fffd_in_txt_and_jsonl(tmp_path):
    txt, jsonl = tmp_path / "t.txt", tmp_path / "t.jsonl"
    txt.write_bytes(b"caf\xe9 au lait\n\nsecond \xff\xfe doc\n")
    jsonl.write_bytes(b'{"text": "caf\xe9 au lait"}\n{"text": "second \xff doc"}\n')
    assert list(load_corpus(txt).documents) == ["caf\ufffd au lait", "second \ufffd\ufffd doc"]
    assert list(load_corpus(jsonl).documents) == ["caf\ufffd au lait", "second \ufffd doc"]


def test_a_list_of_texts_follows_the_same_rule(tok):
    eb = build_windows(["x \udcff " + LONG, LONG], tok, n_batches=1, batch_size=2, ctx=8, mode="first")
    assert eb.tokens.shape == (1, 2, 9)


def test_deeply_nested_json_is_one_bad_record(tmp_path):
    """It was a RecursionError."""
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "a b", "x": ' + "[" * 100_000 + "]" * 100_000 + "}\n" + json.dumps({"text": LONG}) + "\n")
    with pytest.raises(ValueError, match="d.jsonl:1 is not JSON probe reads .*--skip-bad-records"):
        load_corpus(path)
    with pytest.warns(UserWarning, match="skipping records without a string .* as they are read .*d.jsonl:1"):
        assert len(load_corpus(path, skip_bad_records=True)) == 1


def cli(capsys, *args):
    from probe.cli.main import main

    code = main([str(a) if not isinstance(a, str) else a for a in args])
    return subprocess.CompletedProcess(list(args), code, *capsys.readouterr())


def test_view_text_with_an_undecodable_byte(tmp_path, capsys):
    r = cli(capsys, "view", "--text", "abc \udcff def", "--out", str(tmp_path / "v"), "--quiet", "--max-tokens", "8")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    page = (tmp_path / "v" / "view.html").read_text(encoding="utf-8")
    assert "\ufffd" in page or "\\ufffd" in page  # the token's label, as text or as a JSON escape


def test_data_and_out_paths_with_undecodable_bytes(tmp_path, capsys):
    """Each was a UnicodeEncodeError (pyarrow's for the corpus name, the page's for the folder name)."""
    raw = os.fsencode(tmp_path) + b"/bad\xffname.txt"
    with open(raw, "wb") as f:
        f.write(("\n\n".join([LONG] * 4)).encode())
    data, out = os.fsdecode(raw), os.fsdecode(os.fsencode(tmp_path) + b"/out\xff")
    r = cli(capsys, "sinks", "--data", data, *WINDOWS, "--out", out, "--quiet")
    assert r.returncode == 0, r.stderr
    meta = (tmp_path / os.fsdecode(b"out\xff") / "sinks_meta.csv").read_text(encoding="utf-8")
    assert "bad\ufffdname.txt" in meta
    r = cli(capsys, "sinks", "--data", os.fsdecode(raw + b".missing"), *WINDOWS)
    assert_one_line_error(r, "--data")
