"""The BOS rule (docs/definitions.md#bos-rule) for evaluation windows built from text: a BOS first exactly when the
tokenizer's encoding of plain text starts with its BOS or the model was trained with one; caller tokens and explicit
choices as given."""

from __future__ import annotations

import pytest
import torch

from probe.analyses.capture import as_windows
from probe.analyses.sinks import sink_stats
from probe.checkpoints.tiny import build_tiny
from probe.data import load_tokenizer
from probe.data.windows import default_windows, wants_bos


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A tiny llama-family checkpoint whose tokenizer has no BOS template (like Pythia / Qwen)."""
    import probe

    return probe.load(str(build_tiny("llama", tmp_path_factory.mktemp("llama"))))


def test_auto_is_off_for_raw_text_tokenizers(llama):
    tok = llama.tokenizer
    assert not wants_bos(llama, tok)
    eb = default_windows(llama, "wikitext-2-test", n_batches=1, batch_size=2, ctx=16)
    assert eb.bos is False and eb.to_dict()["bos"] is False


def test_trained_with_bos_turns_it_on(llama, monkeypatch):
    monkeypatch.setattr(llama.probe_info, "trained_with_bos", True)
    eb = default_windows(llama, "wikitext-2-test", n_batches=1, batch_size=2, ctx=16)
    assert eb.bos and (eb.tokens[..., 0] == llama.tokenizer.bos_token_id).all()


def test_explicit_choice_overrides(llama):
    on = default_windows(llama, "wikitext-2-test", n_batches=1, batch_size=2, ctx=16, bos=True)
    off = default_windows(llama, "wikitext-2-test", n_batches=1, batch_size=2, ctx=16, bos=False)
    assert on.bos and not off.bos
    assert torch.equal(on.tokens[..., 1:], off.tokens[..., :-1])
    result = sink_stats(llama, on)
    assert bool(result["meta"]["bos"].iloc[0]) is True  # recorded in every result's meta


def test_bos_without_a_bos_token_is_an_error():
    from probe.models import create

    model = create("baseline", tier="tiny", seed=0)
    with pytest.raises(ValueError, match="has no BOS token"):
        default_windows(
            model,
            "wikitext-2-test",
            n_batches=1,
            batch_size=1,
            ctx=16,
            bos=True,
            tokenizer=load_tokenizer("probe-bpe-8k"),
        )


def test_token_tensors_are_used_as_given():
    tokens = torch.arange(34).view(2, 17)
    w = as_windows(tokens)
    assert torch.equal(w.tokens[0], tokens) and "bos" not in w.meta
