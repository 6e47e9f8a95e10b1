"""The tiny checkpoints' tokenizer (probe.checkpoints.tiny.tiny_tokenizer): ``w{i}`` = i as the tests write text, and
real English text in varied ids (not a stream of ``<unk>``), saved and loaded as a plain tokenizer.json."""

from __future__ import annotations

from collections import Counter

import pytest

from probe.checkpoints.tiny import TEXT_WORDS, VOCAB, text_word_patterns, tiny_tokenizer
from probe.data.corpus import load_corpus


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def _paragraph(words: int = 200) -> str:
    """The first WikiText-2 test paragraph of at least ``words`` words in which WikiText's own ``<unk>`` markers (its
    out-of-vocabulary words, unknown to any tokenizer) are under 2% of the words."""
    for doc in load_corpus("wikitext-2-test").documents:
        for line in doc.split("\n"):
            split = line.split()
            if len(split) >= words and split.count("<unk>") < 0.02 * len(split):
                return line
    raise AssertionError("no such paragraph")


def test_w_words_keep_their_ids_and_specials_theirs(tok):
    text = " ".join(f"w{i}" for i in range(2, VOCAB))
    assert tok(text).input_ids == list(range(2, VOCAB))
    assert tok.convert_ids_to_tokens(list(range(2, VOCAB))) == text.split()
    assert tok("w0 w1 w96 w400 <unk> <eos>").input_ids == [0, 0, 0, 0, 0, 1]  # as before: no w{i} beyond the vocabulary
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, tok.unk_token_id, len(tok)) == (0, 1, 1, 0, VOCAB)


def test_english_text_gets_varied_ids_one_per_word(tok):
    paragraph = _paragraph()
    words = paragraph.split()
    ids = tok(paragraph).input_ids
    assert len(ids) == len(words)  # one token per whitespace-separated word, as the word-level tokenizer always gave
    assert len(set(ids)) >= 50, sorted(Counter(ids).items())
    assert ids.count(0) == words.count("<unk>") and ids.count(0) < 0.05 * len(ids)  # no unknown of its own
    assert all(0 <= i < VOCAB for i in ids)
    the, of = tok("The of").input_ids
    assert tok("the THE of").input_ids == [the, the, of] and the != of  # frequent words: one id each, any case


def test_a_corpus_fills_the_vocabulary_and_only_its_unk_markers_are_unknown(tok):
    text = "\n".join(load_corpus("wikitext-2-test").documents)  # 1.3 MB: about a second
    ids = tok(text).input_ids
    assert len(ids) == len(text.split()) and ids.count(0) == text.split().count("<unk>")
    assert set(ids) == set(range(VOCAB)) - {1}  # every id of the vocabulary but EOS
    verse = load_corpus("shakespeare").documents[0][:5000]
    ids = tok(verse).input_ids
    assert 0 not in ids and len(set(ids)) >= 50


def test_text_words_are_the_corpus_most_frequent():
    counts = Counter(w.lower() for doc in load_corpus("wikitext-2-test").documents for w in doc.split())
    assert TEXT_WORDS == tuple(w for w, _ in counts.most_common(len(TEXT_WORDS) + 1) if w != "<unk>")
    assert len(text_word_patterns()) == VOCAB - 2  # one pattern per id 2 ... 95


def test_saved_and_loaded_gives_the_same_ids(tok, tmp_path):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(str(tmp_path), local_files_only=True)
    backend = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    text = _paragraph() + " w3 w4 w95 w0 <eos>"
    assert loaded(text).input_ids == backend.encode(text).ids == tok(text).input_ids
    assert (loaded.bos_token_id, loaded.eos_token_id, loaded.pad_token_id, len(loaded)) == (0, 1, 1, VOCAB)


def test_a_smaller_or_larger_vocabulary_keeps_ids_inside_it():
    small, large = tiny_tokenizer(10), tiny_tokenizer(50304)
    text = _paragraph()
    assert set(small(text).input_ids) <= set(range(10)) and small("w9").input_ids == [9]
    assert large(text).input_ids == tiny_tokenizer()(text).input_ids  # the same ids 2 ... 95 below a larger vocabulary
