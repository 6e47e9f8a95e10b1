"""Big checkpoints across devices: a tiny HF model dispatched by accelerate with a ``max_memory`` that does not hold it
(decoder layers offloaded to disk, their weights on 'meta' between uses) gives the undivided model's logits, hooks and
analyses."""
from __future__ import annotations

import pytest
import torch

import probe
from probe.analyses.inject import inject
from probe.analyses.sinks import sink_stats
from probe.testing import build_tiny


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    pytest.importorskip("accelerate")
    path = str(build_tiny("llama", tmp_path_factory.mktemp("llama")))
    whole = probe.load(path)
    split = probe.load(path, device_map="auto", max_memory={"cpu": "60KB"},
                       offload_folder=str(tmp_path_factory.mktemp("offload")))
    return whole, split


def test_layers_are_really_offloaded(pair):
    _, split = pair
    placement = split.hf_model.hf_device_map
    assert "disk" in placement.values() and "cpu" in placement.values()
    assert any(p.device.type == "meta" for p in split.parameters())


def test_logits_and_hooks_equal_the_undivided_model(pair):
    whole, split = pair
    ids = torch.randint(2, 90, (2, 16), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(split(ids).logits, whole(ids).logits, rtol=0, atol=0)
    names = ["blocks.1.attn.hook_pattern", "blocks.0.attn.hook_v", "blocks.1.hook_resid_post", "hook_embed"]
    _, a = whole.run_with_cache(ids, names_filter=names)
    _, b = split.run_with_cache(ids, names_filter=names)
    for name in names:
        torch.testing.assert_close(b[name], a[name], rtol=0, atol=0, msg=name)
    # an edit through a hook propagates on the dispatched model as on the whole one
    zero_v = [("blocks.0.attn.hook_v", lambda v, hook: torch.zeros_like(v))]
    torch.testing.assert_close(split.run_with_hooks(ids, fwd_hooks=zero_v).logits,
                               whole.run_with_hooks(ids, fwd_hooks=zero_v).logits, rtol=0, atol=0)


def test_analyses_equal_the_undivided_model(pair):
    whole, split = pair
    windows = torch.randint(2, 90, (2, 2, 17), generator=torch.Generator().manual_seed(1))
    for name in ("layers", "heads"):
        torch.testing.assert_close(torch.tensor(sink_stats(split, windows)[name].select_dtypes("number").values),
                                   torch.tensor(sink_stats(whole, windows)[name].select_dtypes("number").values),
                                   rtol=1e-12, atol=1e-12, equal_nan=True)
    got = inject(split, windows, junk=("structured", "gaussian"), doses=(0.4,), progress=False)["results"]
    want = inject(whole, windows, junk=("structured", "gaussian"), doses=(0.4,), progress=False)["results"]
    torch.testing.assert_close(torch.tensor(got["delta"].values), torch.tensor(want["delta"].values),
                               rtol=1e-12, atol=1e-12)
    assert (want["delta"].abs() > 0).all()  # the injection did something to compare
