"""``model.rotary_tables(layer, T)``: each layer's own rotary as (cos, sin) tables, what eviction at positions within
the cache re-rotates queries with (docs/definitions.md#window-eviction). Re-rotating a layer's hook_rot_q from
positions t to t + D with them equals the same forward at position ids shifted by D, on every tiny HF family (Gemma's
local and global bases, partial rotary of GPT-NeoX, YaRN of gpt-oss), and probe's own rotary at t + D."""

from __future__ import annotations

import pytest
import torch

import probe
from probe.checkpoints.tiny import FAMILIES, build_tiny
from probe.hooks import names
from probe.kernels.sink_attention.kept import rerotate
from tests.support.analyses import tiny

T, D = 12, 5


@pytest.mark.parametrize("fam", FAMILIES)
@torch.no_grad()
def test_rerotated_queries_equal_the_forward_at_shifted_positions(fam, tmp_path):
    m = probe.load(str(build_tiny(fam, tmp_path / fam)))
    x = torch.randint(2, 96, (1, T), generator=torch.Generator().manual_seed(0))
    seen: dict[str, list] = {}
    hooks = [
        (names.rot(l, "q"), lambda q, hook: seen.setdefault(hook.name, []).append(q)) for l in range(len(m.blocks))
    ]
    m.run_with_hooks(x, fwd_hooks=hooks)
    m.run_with_hooks(x, fwd_hooks=hooks, position_ids=torch.arange(T)[None] + D)
    t = torch.arange(T)
    for l in range(len(m.blocks)):
        at_t, shifted = seen[names.rot(l, "q")]
        torch.testing.assert_close(
            rerotate(at_t, m.rotary_tables(l, T + D), t, t + D).float(), shifted, atol=2e-6, rtol=0
        )


def test_probe_models_give_their_rotarys_tables():
    model = tiny("baseline")
    rotary = model.blocks[0].attn.rotary
    x = torch.randn(1, T + D, 4, 8, generator=torch.Generator().manual_seed(1))
    t = torch.arange(T)
    at_t = rotary(x[:, :T])
    want = rotary(torch.cat([torch.zeros(1, D, 4, 8), x[:, :T]], 1))[:, D:]  # the same vectors at t + D
    torch.testing.assert_close(rerotate(at_t, model.rotary_tables(0, T + D), t, t + D).float(), want, atol=1e-6, rtol=0)
    assert tiny("baseline", pos="learned").rotary_tables(0, T) is None


@pytest.mark.parametrize("model_type", ["phi", "stablelm", "olmo2", "falcon"])
@torch.no_grad()
def test_families_with_rotate_half_rotary_give_their_tables(model_type):
    """Partial rotary (Phi, StableLM), q/k norms before the rotary (OLMo 2), an attention probe computes itself
    (Falcon): re-rotated hook_rot_q equals the forward at shifted positions."""
    from probe.checkpoints.adapters import adapt
    from probe.checkpoints.tiny import tiny_model

    m = adapt(tiny_model(model_type))
    x = torch.randint(2, 90, (1, T), generator=torch.Generator().manual_seed(0))
    seen: dict[str, list] = {}
    hooks = [(names.rot(0, "q"), lambda q, hook: seen.setdefault(hook.name, []).append(q))]
    m.run_with_hooks(x, fwd_hooks=hooks)
    m.run_with_hooks(x, fwd_hooks=hooks, position_ids=torch.arange(T)[None] + D)
    at_t, shifted = seen[names.rot(0, "q")]
    t = torch.arange(T)
    torch.testing.assert_close(rerotate(at_t, m.rotary_tables(0, T + D), t, t + D).float(), shifted, atol=2e-6, rtol=0)


@pytest.mark.parametrize("model_type", ["gptj", "cohere2", "glm4", "deepseek_v3", "llama4_text", "smollm3"])
def test_other_rotaries_get_no_tables_and_cache_positions_are_refused(model_type):
    """Interleaved pairs (GPT-J, Cohere 2, GLM-4), a rotary part after a latent part (DeepSeek-V3), complex rotations
    (Llama 4), layers without rotary (SmolLM3): no tables, so eviction at cache positions is one line, never a
    rotation of the wrong coordinates."""
    from probe.analyses.ablate import AblationError, check_positions
    from probe.checkpoints.adapters import adapt
    from probe.checkpoints.tiny import tiny_model

    m = adapt(tiny_model(model_type))
    assert all(m.rotary_tables(l, T) is None for l in range(m.probe_info.n_layers))
    with pytest.raises(AblationError, match="rotate-half"):
        check_positions(m, "cache")
