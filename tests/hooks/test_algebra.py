"""The hook algebra (docs/definitions.md#hook-algebra) on every variant of probe's own models, in fp64: each rule that
applies holds to 1e-12, and the checker itself catches a broken rule (a hook that reads the wrong tensor)."""

from __future__ import annotations

import pytest
import torch

from probe.catalogue import VARIANTS
from probe.checkpoints import algebra
from probe.hooks import names
from probe.models import create

CONCRETE = [v.replace("{N}", "4").replace("{r}", "32") for v in VARIANTS]
IDS = torch.randint(0, 8192, (2, 16), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("variant", CONCRETE)
def test_every_rule_that_applies_holds(variant):
    model = create(variant, tier="tiny", seed=0).double()
    errors, skipped = algebra.check(model, IDS)
    assert algebra.failures(errors, 1e-12) == [], (errors, skipped)
    for rule in ("embed", "z", "scores", "result", "rot_q", "rot_k"):
        assert errors[rule] is not None, (rule, skipped)
    if not model.probe_info.has_depth_sources:
        assert errors["resid_mid"] is not None and errors["resid_post"] is not None, skipped


def test_a_hook_reading_the_wrong_tensor_breaks_its_rule():
    """hook_attn_out made to read twice the attention's write: resid_pre + attn_out no longer gives resid_mid."""
    model = create("baseline", tier="tiny", seed=0).double()
    model.blocks[1].hook_attn_out.add_hook(lambda t, hook: t)  # an identity hook changes nothing
    errors, _ = algebra.check(model, IDS)
    assert algebra.failures(errors, 1e-12) == []
    model.reset_hooks()
    handle = model.blocks[1].attn.register_forward_hook(lambda m, i, out: (out[0] * 2, *out[1:]))
    try:  # the module's output doubled after hook_result fired: the result rule sees it
        errors, _ = algebra.check(model, IDS)
    finally:
        handle.remove()
    assert any(f.startswith("result") for f in algebra.failures(errors, 1e-12))


def test_a_depth_routed_model_says_why_the_residual_rules_do_not_apply():
    model = create("attnres-block4", tier="tiny", seed=0).double()
    errors, skipped = algebra.check(model, IDS)
    assert errors["resid_mid"] is None and "depth" in skipped["resid_mid"]
    assert names.resid(0, "mid") in model.hook_dict


@pytest.mark.parametrize("model_type", ["gpt_neox", "falcon", "phi3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_rotary_rule_holds_on_fused_qkv_families_outside_fp64_throughout(model_type, dtype, tmp_path):
    """These families' hook_q is their rotated q turned back (~3e-8 off in fp32; HF's rotary tables are fp32 for fp64
    weights too): the check matched HF's recorded rotary call to hook_q to 1e-9 and, finding none, reported the size
    of the rotation itself (rot_q 0.6-0.9) on a checkpoint whose rotary is right."""
    import probe
    from probe.checkpoints.tiny import tiny_model

    tiny_model(model_type).save_pretrained(tmp_path)
    model = probe.load(tmp_path, dtype=dtype)
    errors, skipped = algebra.check(model, torch.randint(2, 90, (2, 12), generator=torch.Generator().manual_seed(0)))
    for rule in ("rot_q", "rot_k"):
        assert errors[rule] is not None, skipped
        assert errors[rule] <= 1e-6, (rule, errors[rule])
