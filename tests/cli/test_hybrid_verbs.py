"""Hybrid models on the command line (docs/definitions.md#layer-types): every verb runs, in process, on a saved tiny
qwen3_next folder (Gated DeltaNet linear attention in layer 0, gated softmax attention in layer 1) and a tiny lfm2
folder (a short convolution in layer 0, softmax attention in layer 1). A linear layer is never dropped from a
per-layer table and never a KeyError: it is listed, marked ``layer_type`` "linear", with NaN attention statistics and
the residual-stream ones it has (massive activations); model-level means stay over the softmax layers, and the
summary, meta and terminal text say so."""

from __future__ import annotations

import json
import math
import subprocess

import pandas as pd
import pytest
import torch

from probe.cli import main

WINDOWS = ["--batches", "2", "--batch-size", "2", "--ctx", "16"]
FAMILIES = ("qwen3_next", "lfm2")
LINEAR, SOFTMAX = 0, 1  # both tiny models: layer 0 has no softmax attention, layer 1 has
NOTE = "note: layer 0 is linear"


def _save(family: str, folder) -> str:
    """A tiny model of ``family`` saved with its tokenizer; lfm2's tiny config has only attention layers, so layer
    0 becomes its short-convolution layer."""
    from transformers import AutoModelForCausalLM

    from probe.checkpoints.tiny import tiny_config, tiny_tokenizer

    config = tiny_config(family)
    if family == "lfm2":
        config.layer_types, config.full_attn_idxs = ["conv", "full_attention"], [SOFTMAX]
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, attn_implementation="eager").save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return {f: _save(f, tmp_path_factory.mktemp(f)) for f in FAMILIES}


def cli(capsys, *args) -> subprocess.CompletedProcess:
    code = main([str(a) for a in args])
    r = subprocess.CompletedProcess(list(args), code, *capsys.readouterr())
    assert "internal error" not in r.stderr, r.stderr
    return r


def csv(folder, name: str) -> pd.DataFrame:
    return pd.read_csv(folder / f"{name}.csv")


def meta(folder, name: str) -> dict:
    return csv(folder, f"{name}_meta").iloc[0].to_dict()


def assert_linear_row(table: pd.DataFrame, nan_columns, finite_columns=(), **where) -> None:
    """The linear layer's row(s) of a per-layer table: marked, NaN where attention is read, finite elsewhere; the
    softmax layer's rows finite throughout."""
    for key, value in where.items():
        table = table[table[key] == value]
    rows = table.set_index("layer")
    assert sorted(set(rows.index)) >= [LINEAR, SOFTMAX], table
    lin, soft = rows.loc[[LINEAR]], rows.loc[[SOFTMAX]]
    assert (lin["layer_type"] == "linear").all() and (soft["layer_type"] != "linear").all()
    for c in nan_columns:
        assert lin[c].isna().all(), (c, lin[c])
        assert soft[c].notna().all(), (c, soft[c])
    for c in finite_columns:
        assert lin[c].map(math.isfinite).all(), (c, lin[c])


def assert_softmax_meta(m: dict, softmax: str = str(SOFTMAX)) -> None:
    assert str(m["linear_layers"]) == str(LINEAR) and str(m["softmax_layers"]) == softmax, m


@pytest.mark.parametrize("family", FAMILIES)
def test_sinks_lists_the_linear_layer_in_every_per_layer_table(family, saved, capsys, tmp_path):
    out = tmp_path / "s"
    r = cli(capsys, "sinks", "--model", saved[family], *WINDOWS, "--massive", "--dormant", "--out", out, "--quiet")
    assert r.returncode == 0, r.stderr
    assert NOTE in r.stdout and "over its softmax layers" in r.stdout
    assert_linear_row(csv(out, "sinks_layers"), ["pos0_share", "r0", "uniform_ref"])
    assert_linear_row(csv(out, "sinks_sink_eps_layers"), ["sink_share", "key0_mass", "n_heads"])
    assert_linear_row(csv(out, "sinks_dormant_domains"), ["dormant_share", "key0_mass"])
    # massive activations are residual-stream statistics: a linear layer's input stream has them
    massive = csv(out, "sinks_massive_layers")
    assert_linear_row(massive[massive["layer"] < 2], ["key0_mass", "r0"], ["top1", "median", "ratio"])
    assert massive.set_index("layer").loc[2, "layer_type"] == "output"
    summary, by_type = csv(out, "sinks_summary").iloc[0], csv(out, "sinks_by_type").set_index("layers")
    assert summary["layers"] == "softmax" and summary["n_layers"] == 1  # the mean over the softmax layer only
    assert summary["pos0_share"] == pytest.approx(csv(out, "sinks_layers").set_index("layer").loc[1, "pos0_share"])
    assert by_type.loc["linear", "n_layers"] == 1 and math.isnan(by_type.loc["linear", "pos0_share"])
    assert set(csv(out, "sinks_heads")["layer"]) == {SOFTMAX}
    assert_softmax_meta(meta(out, "sinks"))
    assert json.loads((out / "sinks.json").read_text())  # the page's JSON is written too
    assert "linear" in (out / "sinks.html").read_text()


def test_sinks_over_several_contexts_and_the_gu2025_protocol(saved, capsys, tmp_path):
    r = cli(capsys, "sinks", "--model", saved["qwen3_next"], "--batches", "1", "--batch-size", "2", "--ctx", "8", "16",
            "--out", tmp_path / "c", "--quiet")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert NOTE in r.stdout
    layers = csv(tmp_path / "c", "sinks_ctx_layers")
    for ctx in (8, 16):
        assert_linear_row(layers, ["pos0_share", "sink_share"], ctx=ctx)
    r = cli(capsys, "sinks", "--model", saved["qwen3_next"], "--batches", "1", "--batch-size", "2", "--protocol",
            "gu2025", "--out", tmp_path / "g", "--quiet")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert_linear_row(csv(tmp_path / "g", "sinks_sink_eps_layers"), ["sink_share"])


@pytest.mark.parametrize("family", FAMILIES)
def test_inject_injects_the_softmax_layers_and_lists_the_linear_one(family, saved, capsys, tmp_path):
    out = tmp_path / "i"
    r = cli(capsys, "inject", "--model", saved[family], *WINDOWS, "--cutoff", "q25", "median", "--dose", "0.8",
            "--out", out, "--quiet")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert NOTE in r.stdout
    layers = csv(out, "inject_exposure_layers")
    for cutoff in ("q25", "median"):
        assert_linear_row(layers, ["quiet_share", "phantom_share"], cutoff=cutoff)
    assert csv(out, "inject_sinks")["layers"].iloc[0] == "softmax"
    assert_softmax_meta(meta(out, "inject"))


def test_gates_run_on_the_gated_layers_and_mark_the_linear_one(saved, capsys, tmp_path):
    out = tmp_path / "g"
    r = cli(capsys, "gates", "--model", saved["qwen3_next"], *WINDOWS, "--min-count", "2", "--out", out, "--quiet")
    assert r.returncode == 0, r.stderr
    assert NOTE in r.stdout and "the gated layer 1 only" in r.stdout
    layers = csv(out, "gates_layers")
    assert_linear_row(layers, ["mean_gate", "selectivity", "read_mean_gate"])
    summary = csv(out, "gates_summary").iloc[0]
    assert summary["mean_gate"] == pytest.approx(layers.set_index("layer").loc[SOFTMAX, "mean_gate"])
    assert set(csv(out, "gates_heads")["layer"]) == {SOFTMAX}
    assert_softmax_meta(meta(out, "gates"))


def test_gates_refuse_a_hybrid_without_a_gate_in_one_line(saved, capsys, tmp_path):
    r = cli(capsys, "gates", "--model", saved["lfm2"], *WINDOWS, "--out", tmp_path / "g", "--quiet")
    assert r.returncode == 2 and "has no value gate or output gate" in r.stderr


@pytest.mark.parametrize("family", FAMILIES)
def test_ablate_lists_the_linear_layer_beside_each_intervention(family, saved, capsys, tmp_path):
    out = tmp_path / "a"
    extra = ["gate"] if family == "qwen3_next" else []  # the output gate of qwen3_next's softmax layers
    r = cli(capsys, "ablate", "--model", saved[family], *WINDOWS, "--ablate", "knockout", "value", "evict", *extra,
            "--window", "4", "--keep", "1", "--out", out, "--quiet")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert NOTE in r.stdout and "in every softmax layer" in r.stdout
    res = csv(out, "ablate_results")
    for intervention in ("knockout", "value") + tuple(extra):
        assert_linear_row(res, ["loss_ablated", "delta"], intervention=intervention, scope="layer")
    model = res[res["scope"] == "model"]
    assert model["delta"].notna().all() and set(model["intervention"]) == {"knockout", "value", "evict", *extra}
    assert_softmax_meta(meta(out, "ablate"))


@pytest.mark.parametrize("family", FAMILIES)
def test_view_shows_the_softmax_layers_and_names_the_linear_one(family, saved, capsys, tmp_path):
    out = tmp_path / "v"
    r = cli(capsys, "view", "--model", saved[family], "--text", "w3 w4 w5 w6 w7 w8", "--out", out, "--quiet")
    assert r.returncode == 0, r.stderr
    assert "layer 0 is a linear layer (no softmax attention): no pattern to show" in r.stdout
    assert str(meta(out, "view")["linear_layers"]) == "0"
    page = (out / "view.html").read_text()
    assert "<option value='0'>1</option>" in page  # the picker's one choice is layer 1, the softmax layer


@pytest.mark.parametrize("family", FAMILIES)
def test_report_eval_sources_and_costs_on_a_hybrid(family, saved, capsys, tmp_path):
    r = cli(capsys, "report", "--models", saved[family], *WINDOWS, "--out", tmp_path / "r", "--quiet")
    assert r.returncode == 0, r.stderr
    assert "note: " in r.stdout and "layer 0 is linear" in r.stdout
    assert_linear_row(csv(tmp_path / "r", "report_layers"), ["pos0_share"])
    r = cli(capsys, "eval", "--model", saved[family], *WINDOWS, "--out", tmp_path / "e", "--quiet")
    assert r.returncode == 0 and math.isfinite(csv(tmp_path / "e", "eval_summary")["loss"].iloc[0]), r.stderr
    r = cli(capsys, "sources", "--model", saved[family], *WINDOWS, "--out", tmp_path / "so", "--quiet")
    assert r.returncode == 2 and "has no depth routing" in r.stderr  # as for any model without depth routing
    assert cli(capsys, "costs", "--out", tmp_path / "c", "--quiet").returncode == 0
