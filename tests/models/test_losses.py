"""Losses without B x T x V logits: models return final hidden states and analyses unembed a few positions at a
time (Gemma's 262k vocabulary); the losses equal those of the full logits."""

from __future__ import annotations

import pytest
import torch

from probe.checkpoints.tiny import build_tiny


@pytest.mark.parametrize("family", ["llama", "gpt_neox", "gpt_oss", "gemma2", "gemma3_text"])
def test_chunked_losses_equal_full_logits(family, tmp_path):
    """Hidden states unembedded a few positions at a time give the losses of the full logits (final soft-cap too)."""
    import probe
    from probe.analyses.capture import loss_forward_kwargs, output_losses, token_losses

    model = probe.load(str(build_tiny(family, tmp_path / family)))
    ids = torch.randint(2, 90, (2, 21), generator=torch.Generator().manual_seed(0))
    want = token_losses(model(ids[:, :-1]).logits, ids[:, 1:])
    out = model(ids[:, :-1], **loss_forward_kwargs(model))
    assert out.shape == (2, 20, model.probe_info.d_model)  # hidden states, not logits
    torch.testing.assert_close(output_losses(model, out, ids[:, 1:], chunk=7), want, rtol=1e-5, atol=1e-5)


def test_chunked_losses_on_probe_models():
    from probe.analyses.capture import loss_forward_kwargs, output_losses, token_losses
    from probe.models import create

    for variant in ("baseline", "sinktoken"):
        model = create(variant, tier="tiny", seed=0, n_layers=2).eval()
        ids = torch.randint(0, 8192, (2, 33), generator=torch.Generator().manual_seed(1))
        want = token_losses(model(ids[:, :-1]).logits, ids[:, 1:])
        got = output_losses(model, model(ids[:, :-1], **loss_forward_kwargs(model)), ids[:, 1:], chunk=5)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
