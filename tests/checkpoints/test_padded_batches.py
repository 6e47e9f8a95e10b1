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
