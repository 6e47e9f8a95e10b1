"""Padded batches on HF checkpoints (docs/definitions.md#hf-checkpoints): an fp64 checkpoint runs a padded batch
(each row equals the sequence alone), and the families that build their own dense mask (Falcon, MPT) refuse an
attention edit on padded rows as the others do, where the edit used to knock out the pad at index 0 and leave the
row's first token alone."""

from __future__ import annotations

import pytest
import torch

import probe
from probe.analyses.ablate import Ablation, Knockout, ablation_hooks
from probe.checkpoints.tiny import build_tiny
from probe.kernels.sink_attention import edits


def _rows(length: int = 8, pad: int = 3):
    """(ids (2, length), attention mask): row 0 whole, row 1 its first length - pad tokens after pad pads."""
    a = torch.randint(2, 60, (length,), generator=torch.Generator().manual_seed(0))
    ids = torch.stack([a, torch.cat([torch.ones(pad, dtype=torch.long), a[: length - pad]])])
    mask = torch.ones_like(ids)
    mask[1, :pad] = 0
    return ids, mask


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_an_fp64_checkpoint_runs_a_padded_batch_and_each_row_is_its_sequence_alone(family, tmp_path):
    """fp64's min does not fit the fp32 additive mask the padded path built (it raised on any zero in the mask)."""
    m = probe.load(build_tiny(family, tmp_path / family), dtype=torch.float64)
    ids, mask = _rows()
    with torch.no_grad():
        padded = m(ids, attention_mask=mask).logits
        alone = m(ids[1:, 3:]).logits
        _, cache = m.run_with_cache(ids, attention_mask=mask)
    assert padded.dtype == torch.float64
    # the padded row's rotary positions are shifted by the pads: the same relative rotation from HF's fp32 tables
    torch.testing.assert_close(padded[1, 3:], alone[0], atol=1e-6, rtol=0)
    assert torch.isfinite(cache["blocks.0.attn.hook_pattern"]).all()


@pytest.mark.parametrize("family", ["falcon", "mpt"])
def test_a_dense_mask_family_refuses_an_edit_on_padded_rows_and_carries_it_without_padding(family, tmp_path):
    from probe.checkpoints.tiny import tiny_model

    d = tmp_path / family
    tiny_model(family).save_pretrained(d)
    m = probe.load(d)
    ids, mask = _rows()
    hooks = ablation_hooks(m, Ablation(Knockout()))
    with pytest.raises(RuntimeError, match="needs unpadded sequences"), torch.no_grad(), edits.carried(m):
        m.run_with_hooks(ids, attention_mask=mask, fwd_hooks=hooks)
    with torch.no_grad(), edits.carried(m):
        knocked = m.run_with_hooks(ids, fwd_hooks=ablation_hooks(m, Ablation(Knockout())))
    with torch.no_grad(), edits.carried(m):
        ones = m.run_with_hooks(
            ids, attention_mask=torch.ones_like(ids), fwd_hooks=ablation_hooks(m, Ablation(Knockout()))
        )
    with torch.no_grad():
        clean = m(ids).logits
    torch.testing.assert_close(ones, knocked, atol=0, rtol=0)  # an all-ones mask pads nothing
    assert (knocked - clean).abs().max() > 1e-3  # the knockout acts


@pytest.mark.parametrize("family", ["llama", "diffllama"])
def test_a_pad_query_row_of_a_cached_pattern_spreads_evenly_and_the_cached_forward_is_the_plain_one(family, tmp_path):
    """A left-padded sequence's pad queries see no key; their materialised rows had every key at 1 (rows summing to
    Tk = 8: exp(s - lse) with lse = min + log Tk rounded to min), so run_with_cache's logits at the pad positions
    differed from the plain forward's (0.31 on llama) and from transformers' even rows."""
    from probe.checkpoints.tiny import tiny_model, tiny_tokenizer
    from probe.hooks import names

    d = tmp_path / family
    tiny_model(family).save_pretrained(d)
    tiny_tokenizer().save_pretrained(d)
    m = probe.load(d)
    ids, mask = _rows()
    with torch.no_grad():
        plain = m(ids, attention_mask=mask).logits
        cached, cache = m.run_with_cache(ids, attention_mask=mask)
    torch.testing.assert_close(cached, plain, atol=1e-5, rtol=0)  # the pad positions too
    kinds = ("pattern_1", "pattern_2") if family == "diffllama" else ("pattern",)
    for layer in range(m.probe_info.n_layers):
        for kind in kinds:
            rows = cache[names.attn(layer, kind)][1].sum(-1)  # H, T: row 1's first 3 queries are pads
            torch.testing.assert_close(rows, torch.ones_like(rows), atol=1e-5, rtol=0)


def test_a_value_edit_refuses_padded_rows_and_acts_without_padding(tmp_path):
    """A value edit sets position 0's read: on a left-padded row that is a pad, so the edit left the row's first token
    alone (the padded row equalled the clean run exactly, where the edited sequence alone moves its logits by 0.25)."""
    from probe.analyses.interventions.value import ValueEdit

    m = probe.load(build_tiny("llama", tmp_path / "llama"))
    ids, mask = _rows()
    with pytest.raises(RuntimeError, match="needs unpadded sequences"), torch.no_grad():
        m.run_with_hooks(ids, attention_mask=mask, fwd_hooks=ablation_hooks(m, Ablation(ValueEdit("zero"))))
    with torch.no_grad():
        ones = m.run_with_hooks(
            ids, attention_mask=torch.ones_like(ids), fwd_hooks=ablation_hooks(m, Ablation(ValueEdit("zero")))
        )
        edited = m.run_with_hooks(ids, fwd_hooks=ablation_hooks(m, Ablation(ValueEdit("zero"))))
        clean = m(ids).logits
    torch.testing.assert_close(ones, edited, atol=0, rtol=0)  # an all-ones mask pads nothing
    assert (edited - clean).abs().max() > 1e-3  # the edit acts
