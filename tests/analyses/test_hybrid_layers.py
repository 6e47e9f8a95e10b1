"""Analyses on a hybrid model (docs/definitions.md#layer-types), called from Python: a tiny qwen3_next (layer 0 Gated
DeltaNet linear attention, layer 1 gated softmax attention). What the verbs' tests (tests/cli/test_hybrid_verbs.py)
cannot reach: asking for a linear layer by number is one clear error, a pattern-based analysis lists the linear layer,
and models without linear layers get their tables exactly as before (no new column, no new meta key)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from probe.analyses.ablate import (
    Ablation,
    AblationError,
    GateClamp,
    Knockout,
    ValueEdit,
    ablation_hooks,
    find_mechanisms,
    plan,
)
from probe.analyses.backcopy import backcopy_split
from probe.analyses.capture import LayerCollector
from probe.analyses.gates import gated_layers
from probe.analyses.layer_types import layer_meta, with_linear_layers
from probe.analyses.massive import massive_activations
from probe.analyses.view import capture_view
from probe.present.viewers import attention_viewer, view_figures
from tests.support.analyses import tiny, windows


@pytest.fixture(scope="module")
def hybrid():
    from probe.checkpoints.adapters import adapt
    from probe.checkpoints.tiny import tiny_model

    model = adapt(tiny_model("qwen3_next"), name="tiny-qwen3_next")
    assert model.probe_info.layer_types == ["linear", "full"]
    return model


def test_with_linear_layers_adds_one_marked_row_per_group_and_layer():
    info = SimpleNamespace(layer_types=["linear", "full", "linear", "sliding"])
    measured = pd.DataFrame({"cutoff": ["q25", "q25", "median", "median"], "layer": [1, 3, 1, 3], "x": [1.0, 2, 3, 4]})
    out = with_linear_layers(measured, info, by=["cutoff"])
    assert list(out["cutoff"]) == ["q25"] * 4 + ["median"] * 4  # groups in their order, then layers
    assert list(out["layer"]) == [0, 1, 2, 3] * 2
    assert list(out["layer_type"]) == ["linear", "full", "linear", "sliding"] * 2
    assert out["x"].isna().tolist() == [True, False, True, False] * 2
    assert layer_meta(info) == {"linear_layers": "0,2", "softmax_layers": "1,3"}
    plain = SimpleNamespace(layer_types=["full", "sliding"])
    assert with_linear_layers(measured, plain, by=["cutoff"]) is measured and layer_meta(plain) == {}


def test_a_model_without_linear_layers_keeps_its_tables_and_meta():
    model, w = tiny("baseline"), windows(2, 2, 12)
    res = massive_activations(model, w)
    assert "layer_type" not in res["layers"] and "linear_layers" not in res["layers"].attrs["meta"]
    assert "layer_type" not in backcopy_split(model, w, triggers=[1, 2, 3])["layers"]


def test_the_view_captures_the_softmax_layers_and_refuses_a_linear_one(hybrid):
    cap = capture_view(hybrid, list(range(2, 10)))
    assert sorted(cap.patterns) == [1] and cap.linear_layers == [0]
    fig = view_figures(cap)[0]
    assert fig.layout.meta["picker"] == [1, hybrid.probe_info.n_heads, [1]]  # the page labels its one choice "1"
    assert "layer 0 is a linear layer" in fig.layout.title.text
    with pytest.raises(ValueError, match="layer=0: .*linear.*no pattern to view"):
        capture_view(hybrid, list(range(2, 10)), layers=[0])
    with pytest.raises(ValueError, match="is a linear layer, without softmax attention"):
        attention_viewer(cap, 0)


def test_an_ablation_of_a_linear_layer_is_refused_in_one_line(hybrid):
    for edit in (Knockout(), ValueEdit("zero"), GateClamp("closed")):
        with pytest.raises(AblationError, match="layer 0 of model 'tiny-qwen3_next' is a linear layer"):
            ablation_hooks(hybrid, Ablation(edit, layer=0))
    assert ablation_hooks(hybrid, Ablation(Knockout(), layer=1))


def test_eviction_within_the_cache_reads_only_the_softmax_layers_rotary(hybrid):
    mech = find_mechanisms(hybrid, torch.randint(2, 90, (1, 8)))
    conds = plan(hybrid, mech, ["evict"], keep=(1,), windows=(4,), positions=("cache",), per_layer=False)
    assert [c.setting for c in conds] == ["k=1,w=4,pos=cache"]


def test_the_gate_lives_in_the_softmax_layers(hybrid):
    assert gated_layers(hybrid.probe_info, "output") == [1]


def test_the_backcopy_split_lists_the_linear_layer(hybrid):
    res = backcopy_split(hybrid, windows(1, 2, 12, vocab=90, low=2), triggers=[5, 6, 7])
    layers = res["layers"].set_index("layer")
    assert list(layers.index) == [0, 1] and layers.loc[0, "layer_type"] == "linear"
    assert math.isnan(layers.loc[0, "split_score"]) and math.isfinite(layers.loc[1, "split_score"])
    assert set(res["heads"]["layer"]) == {1} and res["layers"].attrs["meta"]["linear_layers"] == "0"


def test_a_collector_waits_only_for_layers_that_need_something(hybrid):
    seen = []
    collector = LayerCollector(hybrid, lambda l: {"hook_v"} if l == 1 else set(), lambda l, got: seen.append(l))
    collector.run(hybrid, torch.randint(2, 90, (1, 6)))
    assert seen == [1]


def test_table_14_rows_of_a_hybrid_model_name_their_layers(hybrid):
    from probe.analyses.sinks import sink_stats
    from probe.experiments.pretrained_sinks import type_table

    table = type_table(
        "tiny-qwen3_next", sink_stats(hybrid, windows(vocab=hybrid.probe_info.vocab_size), progress=False)
    )
    assert list(table["layer_type"]) == ["softmax", "linear"]  # one kind of softmax layer: no per-kind row
    assert table.set_index("layer_type").loc["linear", "n_layers"] == 1
