"""A hook that writes into the activation it is given (``x[:, pos] = patch; return x``, or no return) edits the model
exactly as one that returns an edited copy: on every hook point of probe's variants and of the HF adapters. Where a
model fires a point on a tensor it derived for the hook (scores read back, the heads' writes, the streams' sum) and
carries on from its own copy, an identity check alone dropped such edits silently (probe.hooks.fire). An edit must
also stay in its forward: a second clean forward gives the first one's logits (no parameter written through a
view)."""

from __future__ import annotations

import pytest
import torch

import probe
from probe.checkpoints.tiny import build_tiny
from tests.support.analyses import tiny

VARIANTS = [
    "baseline",
    "sinklogit",
    "softpick",
    "stickbreaking",
    "sigmoid-norm",
    "diff",
    "fox",
    "gatedv",
    "outgate",
    "attnres-full",
    "slr-full-r4",
    "denseformer",
    "mudd",
    "value-residual",
    "hc",
    "hc-dynamic",
    "mhc",
]
HF_TYPES = ["llama", "gemma3_text", "gpt_neox", "diffllama", "deepseek_v4", "gemma3n_text", "qwen2_moe"]


def _points(model) -> list[str]:
    """Every point the model fires (run_with_hooks refuses the ones it never fires)."""
    unfired = model.unfired_points()
    return [name for name in model.hook_dict if model.probe_info.lacks(name) is None and name not in unfired]


def _edit_in_place(x, hook):
    if torch.is_floating_point(x) and x.dim() >= 2 and x.shape[1]:
        x[:, -1].mul_(0.5).add_(0.25)
    return x


def _edit_copy(x, hook):
    if torch.is_floating_point(x) and x.dim() >= 2 and x.shape[1]:
        x = x.clone()
        x[:, -1].mul_(0.5).add_(0.25)
    return x


def _logits(model, ids, hooks=()):
    with torch.no_grad():
        out = model.run_with_hooks(ids, fwd_hooks=list(hooks))
    return out if isinstance(out, torch.Tensor) else out.logits


def _check_every_point(model, ids) -> None:
    clean = _logits(model, ids)
    for name in _points(model):
        in_place = _logits(model, ids, [(name, _edit_in_place)])
        copied = _logits(model, ids, [(name, _edit_copy)])
        where = f"{name}: an in-place edit is not a returned copy's"
        torch.testing.assert_close(in_place, copied, rtol=0, atol=1e-6, equal_nan=True, msg=where)
        torch.testing.assert_close(_logits(model, ids), clean, rtol=0, atol=0, msg=f"{name}: the edit outlived its run")


def perturbed(model):
    """Every parameter moved off its init (mixing weights at init can hide a source an edit reaches)."""
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.1)
    return model


@pytest.mark.parametrize("variant", VARIANTS)
def test_an_in_place_edit_equals_a_returned_copy_on_probes_variants(variant):
    model = perturbed(tiny(variant))
    ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(0))
    _check_every_point(model, ids)


@pytest.mark.parametrize("model_type", HF_TYPES)
def test_an_in_place_edit_equals_a_returned_copy_on_the_hf_adapters(model_type, tmp_path):
    model = probe.load(str(build_tiny(model_type, tmp_path / model_type))).eval()
    ids = torch.randint(3, 60, (2, 9), generator=torch.Generator().manual_seed(0))
    _check_every_point(model, ids)
