"""Corpora, document splitting, training windows (exact resume) and fixed evaluation batches."""

import io
import re

import pytest
import torch

from probe.data import corpus as C
from probe.data import documents as D
from probe.data.batches import EvalBatches, WindowSampler, cap_ctx, eval_batches, tokenize_documents
from probe.data.corpus import CORPORA, Corpus, load_corpus


@pytest.fixture(scope="module")
def tok():
    from probe.data.tokenizer import load_tokenizer

    return load_tokenizer()


def toy_docs():
    """Token documents with known lengths; token values encode (document, position)."""
    lengths = [5, 40, 12, 33, 3, 60, 17, 21, 9, 50]
    return [torch.arange(n) + 1000 * (i + 1) for i, n in enumerate(lengths)]


# ---------------------------------------------------------------- corpora


@pytest.mark.parametrize(
    "name,n_docs", [("wikitext-2-valid", 60), ("wikitext-2-test", 60), ("shakespeare", 42), ("kjv", 66), ("train", 168)]
)
def test_bundled_corpora(name, n_docs):
    c = load_corpus(name)
    assert c.name == name and len(c) == n_docs and name in CORPORA and c.source
    assert all(isinstance(d, str) and len(d) > 1000 for d in c.documents)
    assert re.fullmatch(r"[0-9a-f]{16}", c.fingerprint)
    assert c.to_dict()["corpus_documents"] == n_docs


def test_document_boundaries():
    wiki = load_corpus("wikitext-2-test").documents
    assert wiki[0].startswith("= Robert <unk> =")
    heading = re.compile(r"\n \n = [^=].* = \n \n")
    assert all(d.startswith("= ") and not heading.search(d) for d in wiki)  # one article each
    kjv = load_corpus("kjv").documents
    assert kjv[0].startswith("In the beginning God created") and kjv[18].startswith("Blessed [is] the man")
    assert kjv[17].endswith("old and full of days.")  # Job ends where Psalms is glued on in the source
    assert kjv[14].startswith("Now in the first year of Cyrus") and "go up to Jerusalem" in kjv[14][:600]  # Ezra
    assert kjv[-1].startswith("The Revelation of Jesus Christ") and kjv[-1].endswith("Amen.")
    plays = [d.split("\n")[0] for d in load_corpus("shakespeare").documents]
    assert plays[0] == "ALL'S WELL THAT ENDS WELL" and "HAMLET, PRINCE OF DENMARK" in plays
    assert plays[-1] == "THE WINTER'S TALE"
    train = load_corpus("train").documents
    assert train[0] == load_corpus("shakespeare").documents[0]
    assert train[-1] == load_corpus("wikitext-2-valid").documents[-1]


def test_wikitext_formula_lines_are_not_headings():
    text = " \n = A = \n \n body a \n = 1 x / s = \n 1 y . \n \n = = Sec = = \n \n more \n \n = B = \n \n body b \n"
    docs = D.split_wikitext(text)
    assert len(docs) == 2 and "= 1 x / s =" in docs[0] and "= = Sec = =" in docs[0] and docs[1].startswith("= B =")


def test_local_file_and_directory(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("first para\nline two\n\n\n  \nsecond para\n\nthird\n", encoding="utf-8")
    c = load_corpus(f)
    assert c.documents == ["first para\nline two", "second para", "third"]
    assert c.name == str(f.resolve())
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_text("doc b\n\nstill b", encoding="utf-8")
    (tmp_path / "empty.txt").write_text("\n", encoding="utf-8")
    d = load_corpus(tmp_path)
    assert d.documents == ["first para\nline two\n\n\n  \nsecond para\n\nthird", "doc b\n\nstill b"]
    assert d.fingerprint != c.fingerprint


def test_json_lines_corpus_plain_and_gzip(tmp_path):
    """A .jsonl[.gz] file (a FineWeb-Edu dump, say) is one document per record's "text"; blank texts are dropped."""
    import gzip
    import json

    records = [{"text": "first doc\n\nwith a blank line", "id": 1}, {"text": "  "}, {"text": "second"}]
    lines = "\n".join(json.dumps(r) for r in records) + "\n\n"
    (tmp_path / "a.jsonl").write_text(lines, encoding="utf-8")
    with gzip.open(tmp_path / "a.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write(lines)
    plain, packed = load_corpus(tmp_path / "a.jsonl"), load_corpus(str(tmp_path / "a.jsonl.gz"))
    assert plain.documents == packed.documents == ["first doc\n\nwith a blank line", "second"]
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"body": "no text"}\n', encoding="utf-8")
    bad = load_corpus(tmp_path / "bad.jsonl")  # records are parsed (and checked) as far as documents are read
    with pytest.raises(ValueError, match=r"bad.jsonl:2 is not a JSON object with a \"text\" field"):
        list(bad.documents)
    (tmp_path / "blank.jsonl").write_text('{"text": ""}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="holds no records with text"):
        load_corpus(tmp_path / "blank.jsonl")
    with pytest.raises(FileNotFoundError, match="missing.jsonl.gz"):
        load_corpus("missing.jsonl.gz")


def test_corpus_errors(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match=r"unknown corpus 'wikitext'.*wikitext-2-test"):
        load_corpus("wikitext")
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        load_corpus(tmp_path / "nope.txt")
    (tmp_path / "d").mkdir()
    with pytest.raises(FileNotFoundError, match="no .txt files"):
        load_corpus(tmp_path / "d")
    with pytest.raises(ValueError, match="unknown online corpus 'hf:c4'"):
        load_corpus("hf:c4")
    with pytest.raises(ValueError, match="bad document count 'many'"):
        load_corpus("hf:fineweb-edu:many")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(C, "_hub_reachable", lambda *a, **k: False)
    with pytest.raises(ConnectionError, match="unreachable; offline use the bundled 'wikitext-2-test'") as e:
        load_corpus("hf:wikitext-2-raw-v1:test")
    assert "\n" not in str(e.value)


def test_hf_corpora_parse_dataset_records(monkeypatch):
    """The online path, with a stand-in for `datasets` (records shaped like the hub's: one line each, blanks as '')."""
    import sys
    import types

    calls = []

    def load_dataset(*args, **kwargs):
        calls.append((args, kwargs))
        if args[0] == "wikitext":
            return {
                "text": [
                    "",
                    " = A = \n",
                    "",
                    " body a \n",
                    "",
                    " = = Sec = = \n",
                    "",
                    " more a \n",
                    "",
                    " = B = \n",
                    "",
                    " body b \n",
                ]
            }
        return iter({"text": f"web doc {i}"} for i in range(100))

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    w = load_corpus("hf:wikitext-2-raw-v1:test")
    assert w.name == "hf:wikitext-2-raw-v1:test" and len(w) == 2
    assert w.documents[0].startswith("= A =") and "= = Sec = =" in w.documents[0] and w.documents[1].endswith("body b")
    f = load_corpus("hf:fineweb-edu:3")
    assert f.documents == ["web doc 0", "web doc 1", "web doc 2"]
    assert calls[0] == (("wikitext", "wikitext-2-raw-v1"), {"split": "test"})
    assert calls[1][1]["streaming"] is True


# ---------------------------------------------------------------- tokenized documents and training windows


def test_tokenize_documents(tok):
    docs = tokenize_documents(["Hello there.", "A second document."], tok)
    assert [d.dtype for d in docs] == [torch.long, torch.long]
    assert tok.decode(docs[0]) == "Hello there." and tok.eos_token_id not in docs[0].tolist()


def test_window_sampler_deterministic_and_seeded():
    docs = toy_docs()
    a, b, c = (WindowSampler(docs, 8, s, eos_id=7) for s in (0, 0, 1))
    wa, wb, wc = a.sample(16), b.sample(16), c.sample(16)
    assert wa.shape == (16, 9) and wa.dtype == torch.long
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)
    stream = a.stream
    assert len(stream) == sum(len(d) for d in docs) + len(docs) - 1
    assert stream[5] == 7 and stream[6] == 2000  # EOS between documents 0 and 1
    for w in wa:  # every window is a contiguous slice of the stream
        assert any(torch.equal(stream[s : s + 9], w) for s in range(len(stream) - 8))
    pos = torch.tensor([0, 4, 5, 6, 46, 47])
    assert a.document_of(pos).tolist() == [0, 0, 0, 1, 1, 2]


def test_window_sampler_resume_is_exact():
    docs = toy_docs()
    s = WindowSampler(docs, 8, 3, eos_id=7)
    s.sample(4), s.sample(5)
    buf = io.BytesIO()
    torch.save(s.state_dict(), buf)
    expected = [s.sample(6) for _ in range(3)]
    r = WindowSampler(docs, 8, 999, eos_id=7)
    buf.seek(0)
    r.load_state_dict(torch.load(buf))
    assert r.count == 9 and r.seed == 3
    assert all(torch.equal(r.sample(6), e) for e in expected)
    with pytest.raises(ValueError, match="ctx=8 but this sampler has ctx=4"):
        WindowSampler(docs, 4, 3, eos_id=7).load_state_dict(s.state_dict())


def test_window_sampler_errors():
    with pytest.raises(ValueError, match="hold 3 tokens.*ctx\\+1 = 9"):
        WindowSampler([torch.arange(3)], 8, eos_id=0)
    with pytest.raises(ValueError, match="no documents"):
        WindowSampler([], 8, eos_id=0)


# ---------------------------------------------------------------- evaluation batches


def test_eval_first_window_per_document(tok):
    docs = toy_docs()
    eb = eval_batches(docs, tok, n_batches=2, batch_size=3, ctx=15, seed=0)
    assert isinstance(eb, EvalBatches) and eb.tokens.shape == (2, 3, 16) and eb.doc_ids.shape == (2, 3)
    ids = eb.doc_ids.flatten().tolist()
    assert len(set(ids)) == 6 and all(len(docs[i]) >= 16 for i in ids)  # distinct, only long-enough documents
    assert set(ids) == {1, 3, 5, 6, 7, 9}  # all six eligible documents (lengths 40, 33, 60, 17, 21, 50)
    for w, i in zip(eb.tokens.view(-1, 16), ids):
        assert torch.equal(w, docs[i][:16])  # the first ctx+1 tokens of its document
    assert len(eb) == 2 and [b.shape for b in eb] == [(3, 16), (3, 16)]
    assert torch.equal(eb.inputs[..., 1:], eb.targets[..., :-1])
    assert eb.to_dict() == {
        "corpus": "custom-tokens",
        "corpus_fingerprint": "",
        "tokenizer": "probe-bpe-8k",
        "mode": "first",
        "seed": 0,
        "ctx": 15,
        "n_batches": 2,
        "batch_size": 3,
        "n_documents": 6,
        "bos": False,
    }
    again = eval_batches(docs, tok, n_batches=2, batch_size=3, ctx=15, seed=0)
    assert torch.equal(again.tokens, eb.tokens)
    orders = {
        tuple(eval_batches(docs, tok, n_batches=1, batch_size=6, ctx=15, seed=s).doc_ids.flatten().tolist())
        for s in range(6)
    }
    assert len(orders) > 1  # the document order depends on the seed
    small = eval_batches(docs, tok, n_batches=1, batch_size=4, ctx=15, seed=0)
    assert small.doc_ids.flatten().tolist() == ids[:4]  # fewer windows = a prefix of the same order


def test_eval_sequential_and_random(tok):
    docs = toy_docs()
    first = eval_batches(docs, tok, n_batches=1, batch_size=6, ctx=15, seed=2)
    seq = eval_batches(docs, tok, n_batches=2, batch_size=5, ctx=15, seed=2, mode="sequential")
    assert torch.equal(seq.tokens.view(-1, 16)[:6], first.tokens.view(-1, 16))  # round 0 is mode 'first'
    for w, i in zip(seq.tokens.view(-1, 16)[6:], seq.doc_ids.flatten()[6:].tolist()):
        assert torch.equal(w, docs[i][16:32])  # round 1: second window of documents with >= 32 tokens
    rnd = eval_batches(docs, tok, n_batches=3, batch_size=4, ctx=15, seed=5, mode="random")
    sampler = WindowSampler(docs, 15, 5, eos_id=tok.eos_token_id)
    starts = sampler.starts(12)
    assert torch.equal(rnd.tokens.view(-1, 16), sampler.windows(starts))
    assert torch.equal(rnd.doc_ids.flatten(), sampler.document_of(starts))
    assert rnd.mode == "random"


@pytest.mark.parametrize("mode", ["first", "sequential", "random"])
def test_eval_windows_with_bos(tok, mode):
    """With a BOS each window is BOS + the first ctx text tokens of the window drawn without one
    (docs/definitions.md#bos-rule)."""
    docs = toy_docs()
    plain = eval_batches(docs, tok, n_batches=2, batch_size=3, ctx=15, seed=1, mode=mode)
    bos = eval_batches(docs, tok, n_batches=2, batch_size=3, ctx=15, seed=1, mode=mode, bos_id=7777)
    assert bos.tokens.shape == plain.tokens.shape and bos.bos and not plain.bos and bos.to_dict()["bos"] is True
    assert (bos.tokens[..., 0] == 7777).all()
    if mode != "random":  # the same documents; random mode draws windows one token shorter from the stream
        assert torch.equal(bos.doc_ids, plain.doc_ids)
        assert torch.equal(bos.tokens[..., 1:], plain.tokens[..., :-1])
    assert (bos.tokens[..., 1:] != 7777).all()  # exactly one BOS, never a second


def test_prepends_bos(tok):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    from probe.data import prepends_bos

    assert prepends_bos(tok) is False  # probe-bpe-8k: raw text, no BOS
    vocab = {"<bos>": 0, "<eos>": 1, "a": 2, "b": 3, "[UNK]": 4}
    inner = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    inner.pre_tokenizer = pre_tokenizers.Whitespace()
    inner.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 0)])
    gemma_like = PreTrainedTokenizerFast(tokenizer_object=inner, bos_token="<bos>", eos_token="<eos>")
    assert prepends_bos(gemma_like) is True
    inner.post_processor = processors.TemplateProcessing(single="$A", special_tokens=[])
    has_bos_but_does_not_add = PreTrainedTokenizerFast(tokenizer_object=inner, bos_token="<bos>", eos_token="<eos>")
    assert prepends_bos(has_bos_but_does_not_add) is False


def test_eval_batches_on_bundled_corpus(tok):
    eb = eval_batches("wikitext-2-test", tok, n_batches=2, batch_size=4, ctx=64, seed=1)
    assert eb.tokens.shape == (2, 4, 65) and eb.corpus == "wikitext-2-test"
    docs = tokenize_documents("wikitext-2-test", tok)
    i = eb.doc_ids[1, 2].item()
    assert torch.equal(eb.tokens[1, 2], docs[i][:65])
    assert tok.decode(eb.tokens[0, 0]).startswith("= ")  # windows start at an article title
    assert eb.to_dict()["corpus_fingerprint"] == load_corpus("wikitext-2-test").fingerprint
    with pytest.raises(ValueError, match="has 60 documents .* can supply 60 windows, not n_batches\\*batch_size=64"):
        eval_batches("wikitext-2-test", tok)  # 8 x 8 first windows need 64 articles


def test_eval_batches_errors(tok):
    docs = toy_docs()
    with pytest.raises(ValueError, match="n_batches=0"):
        eval_batches(docs, tok, n_batches=0)
    with pytest.raises(ValueError, match="batch_size=0"):
        eval_batches(docs, tok, batch_size=0)
    with pytest.raises(ValueError, match="ctx=1 must be at least 2"):
        eval_batches(docs, tok, ctx=1)
    with pytest.raises(ValueError, match="unknown mode 'all'"):
        eval_batches(docs, tok, mode="all")
    with pytest.raises(ValueError, match="has 6 documents .* can supply 6 windows, not n_batches\\*batch_size=8"):
        eval_batches(docs, tok, n_batches=2, batch_size=4, ctx=15)
    with pytest.raises(ValueError, match="holds 259 tokens"):
        eval_batches(docs, tok, ctx=300, mode="random")


def test_cap_ctx():
    assert cap_ctx(None, 2048) == 1024 and cap_ctx(None, 256) == 256 and cap_ctx(None, None) == 1024
    assert cap_ctx(512, 2048) == 512
    with pytest.raises(ValueError, match="ctx=4096 exceeds the model's maximum context n_ctx=2048"):
        cap_ctx(4096, 2048)
    with pytest.raises(ValueError, match="ctx=1"):
        cap_ctx(1, 2048)


def test_corpus_dataclass_in_memory(tok):
    c = Corpus("mine", ["alpha beta gamma " * 30, "short"], "test")
    eb = eval_batches(c, tok, n_batches=1, batch_size=1, ctx=20)
    assert eb.corpus == "mine" and eb.doc_ids.tolist() == [[0]]


def test_heldout_split_is_deterministic_disjoint_and_never_sampled():
    """probe train's default validation: 5% of the training corpus's documents (smallest SHA-256), the same whatever
    the document order, none of them in what the sampler draws from."""
    from probe.data.corpus import split_heldout

    mix = load_corpus("train")
    keep, held = split_heldout(mix)
    assert len(held) == round(0.05 * len(mix)) == 8 and len(keep) + len(held) == len(mix)
    assert not set(keep.documents) & set(held.documents) and held.name == "train:heldout"
    shuffled = Corpus("train", list(reversed(mix.documents)))
    assert sorted(split_heldout(shuffled)[1].documents) == sorted(held.documents)
    from argparse import Namespace

    from probe.cli.train import _corpora

    trained_on, validated_on = _corpora(Namespace(data="train", eval_data="heldout"))  # what `probe train` uses
    assert trained_on.documents == keep.documents and validated_on.documents == held.documents
    other = _corpora(Namespace(data="train", eval_data="wikitext-2-test"))
    assert other[0].documents == mix.documents and other[1].name == "wikitext-2-test"
    with pytest.raises(ValueError, match="at least 2"):
        split_heldout(Corpus("one", ["a single document"]))


def test_train_on_a_one_document_corpus_is_one_line_before_any_warning(tmp_path, capsys):
    """The held-out split cannot be made from one document: `probe train` says so in one line (the warmup warning of
    a short run waits until the data are known good) and names the flag that fixes it; nothing is written."""
    from probe.cli.main import main

    (tmp_path / "one.txt").write_text("a single document " * 50)
    rc = main(["train", "--data", str(tmp_path / "one.txt"), "--steps", "1", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "has 1 document(s); a held-out split needs at least 2" in err and "--eval-data CORPUS" in err
    assert not (tmp_path / "run").exists()
