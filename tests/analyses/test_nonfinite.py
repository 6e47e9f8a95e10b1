"""No verdict drawn from NaN (docs/definitions.md#sink-rule): a model whose attention, hidden states
or logits hold NaN or infinite values stops every numeric analysis with one line naming the tensor and its layer (exit
2 from the CLI), or with allow_nonfinite / --allow-nonfinite is reported with its numbers computed over every entry
(NaN propagates: no head is dropped from a mean), a ``nonfinite`` table and no verdict."""

from __future__ import annotations

import json
import math
import re

import pandas as pd
import pytest
import torch

from probe.analyses.finite import FiniteCheck, count_nonfinite
from probe.analyses.inject import inject
from probe.analyses.massive import massive_activations
from probe.analyses.sink_pass import sink_analyses
from probe.analyses.sinks import sink_stats, sink_stats_reference
from probe.errors import UsageError
from probe.present import inject as inject_text
from probe.present import sinks as sinks_text
from probe.present.terminal import verdict_sentences
from tests.support.analyses import tiny, windows


def nan_in_layer_1(variant="baseline", **over):
    """A tiny model with one NaN in layer 1's query projection: one query head of layer 1 is NaN throughout."""
    model = tiny(variant, **over)
    with torch.no_grad():
        model.blocks[1].attn.q_proj.weight[0, 0] = float("nan")
    return model


def test_the_check_counts_nan_and_infinite_entries_and_names_the_tensor():
    t = torch.tensor([1.0, float("nan"), float("inf"), -float("inf")])
    assert count_nonfinite(t) == (1, 2, 4)
    assert count_nonfinite(torch.arange(3)) == (0, 0, 3)
    with pytest.raises(UsageError) as e:
        FiniteCheck().check("blocks.1.attn.hook_pattern", t, 1)
    assert e.value.one_line() == (
        "non-finite values in blocks.1.attn.hook_pattern (layer 1): 1 of 4 entries are NaN and 2 infinite; "
        "pass --allow-nonfinite to report the numbers without a verdict"
    )
    check = FiniteCheck(allow=True)
    check.check("x", t, 1)
    check.check("x", t, 1)  # summed over batches
    assert check.table().to_dict("records") == [{"tensor": "x", "layer": 1, "n_nan": 2, "n_inf": 4, "n_entries": 8}]


@pytest.mark.parametrize("analysis", [sink_stats, sink_stats_reference, sink_analyses, massive_activations])
def test_a_nan_weight_stops_the_attention_analyses_naming_layer_and_tensor(analysis):
    with pytest.raises(UsageError, match=r"^non-finite values in blocks\.1\.(attn\.hook_\w+|hook_\w+) \(layer 1\)"):
        analysis(nan_in_layer_1(), windows(2, 2, 16))


def test_a_nan_weight_stops_injection():
    with pytest.raises(UsageError, match=r"non-finite values in blocks\.1\.attn\.hook_rot_q \(layer 1\)"):
        inject(nan_in_layer_1(), windows(2, 2, 16), junk=["gaussian"], doses=[0.4], progress=False)
    with pytest.raises(UsageError, match=r"non-finite values in logits"):  # exposure off: the losses are checked
        inject(nan_in_layer_1(), windows(2, 2, 16), junk=["gaussian"], doses=[0.4], progress=False, exposure=False)


def test_allowed_the_numbers_keep_the_nan_and_no_verdict_is_drawn():
    found = sink_analyses(nan_in_layer_1(), windows(2, 2, 16), allow_nonfinite=True)
    sinks, eps = found["sinks"], found["sink_eps"]
    assert set(sinks["nonfinite"]["tensor"]) >= {"blocks.1.attn.hook_rot_q"}
    assert set(sinks["nonfinite"]["layer"]) == {1}
    layers = sinks["layers"].set_index("layer")
    assert math.isfinite(layers.at[0, "pos0_share"]) and math.isnan(layers.at[1, "pos0_share"])  # not 3 heads' mean
    s = sinks["summary"].iloc[0]
    assert math.isnan(s["pos0_share"]) and math.isnan(s["pos0_over_uniform"])  # not layer 0's alone
    assert s["sink_formed"] is None
    assert math.isnan(eps["summary"]["n_sink_heads"].iloc[0])  # a NaN head is neither a sink head nor not one
    assert math.isnan(eps["summary"]["sink_share"].iloc[0])
    batches = sinks["batches"]
    assert batches.loc[batches["layer"] == 1, "pos0_share"].isna().all()
    result = {**sinks, **{f"sink_eps_{k}": v for k, v in eps.items() if k != "meta"}}
    (sentence,) = verdict_sentences(sinks_text.text(result))
    assert sentence.startswith("no verdict: non-finite values in blocks.1.attn.hook_rot_q (layer 1)")
    assert "no sink has formed" not in sinks_text.text(result) and "a sink has formed:" not in sinks_text.text(result)
    assert sinks_text.sink_sections(result)["verdicts"][0] == sentence


def test_allowed_injection_reports_its_numbers_without_a_verdict():
    result = inject(
        nan_in_layer_1(), windows(2, 2, 16), junk=["gaussian"], doses=[0.4], progress=False, allow_nonfinite=True
    )
    assert result["results"]["delta"].isna().all()
    assert result["exposure"]["quiet_share"].isna().all()  # not the finite heads' share
    assert result["sinks"]["sink_formed"].iloc[0] is None
    (sentence,) = verdict_sentences(inject_text.text(result))
    assert sentence.startswith("no verdict: non-finite values in blocks.1.attn.hook_rot_q (layer 1)")
    assert "logits (next-token losses of the clean pass)" in set(result["nonfinite"]["tensor"])


def test_a_finite_model_has_no_nonfinite_table():
    model, toks = tiny("sinklogit"), windows(2, 2, 16)
    found = sink_analyses(model, toks, allow_nonfinite=True)
    assert "nonfinite" not in found["sinks"] and found["sinks"]["summary"]["sink_formed"].dtype == bool
    pd.testing.assert_frame_equal(found["sinks"]["summary"], sink_stats(model, toks)["summary"])


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Saved tiny llama folders: one NaN in layer 1's q_proj weight; one infinite entry in layer 0's k_proj weight;
    rope_theta 0 (NaN rotary angles, refused by the config check before anything is built); and a text in their
    vocabulary."""
    from probe.checkpoints.tiny import build_tiny, tiny_model, tiny_tokenizer

    root = tmp_path_factory.mktemp("nonfinite")
    model = tiny_model("llama")
    with torch.no_grad():
        model.model.layers[1].self_attn.q_proj.weight[0, 0] = float("nan")
    model.save_pretrained(root / "nan_q")
    tiny_tokenizer().save_pretrained(root / "nan_q")
    model = tiny_model("llama")
    with torch.no_grad():
        model.model.layers[0].self_attn.k_proj.weight[0, 0] = float("inf")
    model.save_pretrained(root / "inf_k")
    tiny_tokenizer().save_pretrained(root / "inf_k")
    theta = build_tiny("llama", root / "theta0")
    config = json.loads((theta / "config.json").read_text())
    if "rope_parameters" in config:
        config["rope_parameters"]["rope_theta"] = 0.0
    else:
        config["rope_theta"] = 0.0
    (theta / "config.json").write_text(json.dumps(config))
    words = root / "words.txt"
    words.write_text(" ".join(f"w{2 + (7 * i) % 94}" for i in range(400)) + "\n")
    return {"nan_q": root / "nan_q", "inf_k": root / "inf_k", "theta0": theta, "data": words}


def run_cli(args, capsys, monkeypatch):
    from probe.cli.main import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        code = main([str(a) for a in args])
    finally:
        torch.set_num_threads(threads)
    out, err = capsys.readouterr()
    return code, out, err


WINDOWS = ["--batches", "2", "--batch-size", "2", "--ctx", "32", "--quiet"]


@pytest.mark.parametrize("verb", ["sinks", "inject"])
@pytest.mark.parametrize("folder, tensor", [("nan_q", "blocks.1.attn.hook_rot_q (layer 1)"),
                                            ("inf_k", "blocks.0.attn.hook_rot_k (layer 0)")])  # fmt: skip
def test_the_cli_exits_2_with_one_line_or_reports_without_a_verdict(verb, folder, tensor, saved, capsys, monkeypatch):
    args = [verb, "--model", saved[folder], "--data", saved["data"], *WINDOWS]
    args += ["--junk", "gaussian", "--dose", "0.4"] if verb == "inject" else []
    code, out, err = run_cli(args, capsys, monkeypatch)
    assert code == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert line.startswith(f"probe {verb}: error: non-finite values in {tensor}: ")
    assert re.search(
        r"entries are NaN( and \d+ infinite)?; pass --allow-nonfinite to report the numbers without a verdict$", line
    )
    code, out, err = run_cli([*args, "--allow-nonfinite"], capsys, monkeypatch)
    assert code == 0, err
    (sentence,) = verdict_sentences(out)
    assert sentence.startswith(f"no verdict: non-finite values in {tensor}")
    assert "non-finite values (NaN or infinite entries" in out
    assert not any(s in out for s in ("no sink has formed", "a sink has formed:", "an effect", "nan%"))


@pytest.mark.parametrize("verb", ["sinks", "inject"])
def test_a_rotary_base_of_zero_is_refused_before_the_model_is_built(verb, saved, capsys, monkeypatch):
    code, out, err = run_cli([verb, "--model", saved["theta0"], "--data", saved["data"], *WINDOWS], capsys, monkeypatch)
    assert code == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert "rope_theta=0.0" in line and "rotary base" in line


@pytest.mark.parametrize("variant, analysis", [("sink+proj", "gate_stats"), ("attnres-block4", "effective_sources")])
def test_gates_and_sources_stop_too(variant, analysis):
    from probe.analyses import gates, sources

    run = {"gate_stats": gates.gate_stats, "effective_sources": sources.effective_sources}[analysis]
    with pytest.raises(
        UsageError, match=r"^non-finite values in blocks\.1\..* \(layer 1\): .*entries are NaN; no verd"
    ):
        run(nan_in_layer_1(variant), windows(2, 2, 16))


def test_allowed_massive_and_dormant_counts_are_nan_not_zero():
    toks = windows(2, 2, 16)
    found = sink_analyses(nan_in_layer_1(), toks, massive=True, dormant={"a": toks}, allow_nonfinite=True)
    massive = found["massive"]
    assert "blocks.1.hook_resid_post" in set(massive["nonfinite"]["tensor"])
    assert massive["summary"]["massive"].iloc[0] is None and math.isnan(massive["summary"]["n_massive"].iloc[0])
    sites = massive["layers"].set_index("layer")
    assert sites.at[0, "n_massive"] == 0 and math.isnan(sites.at[2, "n_massive"])  # the NaN final stream: no count
    dormant = found["dormant"]
    assert math.isnan(dormant["summary"]["dormant_share"].iloc[0])  # not the share among the finite heads
    by_layer = dormant["domains"].set_index("layer")
    assert math.isfinite(by_layer.at[0, "dormant_share"]) and math.isnan(by_layer.at[1, "dormant_share"])
