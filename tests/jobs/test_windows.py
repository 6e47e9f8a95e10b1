"""One window builder (``probe.data.windows``, docs/definitions.md#evaluation-windows): the analyses' Python default
and the command line's inputs cut the same windows, the BOS rule (docs/definitions.md#bos-rule) lives with the data,
and the inputs only name the flags in its errors."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import probe
from probe.data import load_tokenizer
from probe.data.windows import build_windows, default_windows, eval_context, window_bos_id
from probe.errors import UsageError
from probe.jobs.inputs import WindowCache, make_windows, windows_for
from probe.jobs.specs import WindowSpec


@pytest.fixture(scope="module")
def baseline():
    return probe.load("probe/tiny-baseline")


def _model(family="probe", n_ctx=64, trained_with_bos=False, record=None):
    info = SimpleNamespace(family=family, n_ctx=n_ctx, trained_with_bos=trained_with_bos, name="m")
    return SimpleNamespace(probe_info=info, train_record=record)


def test_the_inputs_and_the_python_default_cut_the_same_windows(baseline):
    spec = WindowSpec(data="wikitext-2-test", batches=2, batch_size=2, ctx=16, mode="first", seed=3)
    ours, tok = windows_for(spec, baseline)
    default = default_windows(baseline, "wikitext-2-test", n_batches=2, batch_size=2, ctx=16, seed=3)
    assert torch.equal(ours.tokens.cpu(), default.tokens) and ours.to_dict() == default.to_dict()
    assert tok is baseline.tokenizer and ours.bos is False  # probe's text zoo: raw text
    cache = WindowCache(spec)  # a run's models that share a tokenizer, context and BOS share the windows
    assert cache.get(baseline, tok, 16) is not None and len(cache.cache) == 1 and len(cache.docs) == 1
    cache.get(baseline, tok, 16)
    assert len(cache.cache) == 1
    assert torch.equal(cache.get(baseline, tok, 16).tokens.cpu(), default.tokens)


def test_the_bos_id_is_the_tokenizers_or_the_one_training_recorded():
    with_bos = SimpleNamespace(bos_token_id=7, name_or_path="t")
    without = SimpleNamespace(bos_token_id=None, name_or_path="t")
    trained = _model(trained_with_bos=True, record={"bos": True, "bos_id": 5})
    assert window_bos_id(trained, with_bos) == 7
    assert window_bos_id(trained, without) == 5  # the EOS that `probe train --bos` used
    assert window_bos_id(trained, without, bos=False) is None
    with pytest.raises(ValueError, match="tokenizer 't' has no BOS token"):
        window_bos_id(_model(), without, bos=True)


def test_the_context_of_a_probe_model_and_of_a_checkpoint():
    assert eval_context(_model(n_ctx=64)) == 64  # a probe model's training context
    assert eval_context(_model(family="gpt_neox", n_ctx=2048)) == 1024  # HF checkpoints: min(1024, maximum)
    assert eval_context(_model(family="gpt_neox", n_ctx=2048), 100) == 100
    with pytest.raises(ValueError, match="exceeds the model's maximum context"):
        eval_context(_model(n_ctx=64), 65)


def test_auto_falls_back_to_sequential_windows_and_errors_name_the_corpus_then_the_flags():
    tok = load_tokenizer("probe-bpe-8k")
    first = build_windows("wikitext-2-test", tok, n_batches=1, batch_size=4, ctx=32, mode="first")
    auto = build_windows("wikitext-2-test", tok, n_batches=1, batch_size=4, ctx=32, mode="auto")
    assert auto.mode == "first" and torch.equal(auto.tokens, first.tokens)
    many = build_windows("wikitext-2-test", tok, n_batches=20, batch_size=8, ctx=32, mode="auto")
    assert many.mode == "sequential"  # 160 windows: more than WikiText-2 test's 60 articles
    with pytest.raises(ValueError, match="corpus 'wikitext-2-test' has .* non-overlapping windows"):
        build_windows("wikitext-2-test", tok, n_batches=1000, batch_size=8, ctx=512, mode="auto")
    with pytest.raises(ValueError, match="beyond the model's vocabulary of 100"):
        build_windows("wikitext-2-test", tok, n_batches=1, batch_size=1, ctx=16, vocab_size=100)
    corpus = probe.data.load_corpus("wikitext-2-test")
    with pytest.raises(UsageError, match=r"--data 'wikitext-2-test': it has .* --batches x --batch-size"):
        make_windows(corpus, tok, n_batches=1000, batch_size=8, ctx=512, seed=0, mode="first", vocab_size=8192)
    with pytest.raises(UsageError, match="a matching --tokenizer"):
        make_windows(corpus, tok, n_batches=1, batch_size=1, ctx=16, seed=0, mode="first", vocab_size=100)
