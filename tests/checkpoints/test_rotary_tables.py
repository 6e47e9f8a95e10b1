"""``model.rotary_tables(layer, T)``: each layer's own rotary as (cos, sin) tables, what eviction at positions within
the cache re-rotates queries with (docs/definitions.md#window-eviction). Re-rotating a layer's hook_q from positions t
to t + D with them equals the same forward at position ids shifted by D, on every tiny HF family (Gemma's local and
global bases, partial rotary of GPT-NeoX, YaRN of gpt-oss), and probe's own rotary at t + D."""

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
        (names.attn(l, "q"), lambda q, hook: seen.setdefault(hook.name, []).append(q)) for l in range(len(m.blocks))
    ]
    m.run_with_hooks(x, fwd_hooks=hooks)
    m.run_with_hooks(x, fwd_hooks=hooks, position_ids=torch.arange(T)[None] + D)
    t = torch.arange(T)
    for l in range(len(m.blocks)):
        at_t, shifted = seen[names.attn(l, "q")]
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
