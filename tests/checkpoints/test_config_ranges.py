"""The one table of config values probe reads (probe.checkpoints.config_ranges.RANGES): a value outside its range is
one line on the command line, exit code 2, naming the key, the value and the valid range, before anything is built
from it; every tiny config of the coverage suite, probe's own and the authors' configs stay within it."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from probe.checkpoints.config_ranges import RANGES, SIZE_KEYS, config_problem
from probe.checkpoints.sizes import CheckpointSizeError, check_config
from tests.support.cli import assert_one_line_error
from tests.support.verbs import WINDOWS, save_tiny

AUTHORS = Path(__file__).resolve().parents[1] / "fixtures" / "authors"
ZOO = Path(__file__).resolve().parents[2] / "probe" / "zoo"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """One saved tiny folder per model_type, made on first use."""
    root, made = tmp_path_factory.mktemp("saved"), {}

    def folder(model_type: str) -> Path:
        if model_type not in made:
            made[model_type] = save_tiny(model_type, root / model_type)
        return made[model_type]

    return folder


def edited(src: Path, dst: Path, **config) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**cfg, **config}))
    return dst


def run_sinks(folder: Path, out: Path, capsys) -> subprocess.CompletedProcess:
    from probe.cli.main import main

    capsys.readouterr()  # what saving the folder printed
    code = main(["sinks", "--model", str(folder), *WINDOWS, "--out", str(out), "--quiet"])
    return subprocess.CompletedProcess([], code, *capsys.readouterr())


ROPE = {"rope_type": "linear", "factor": 0, "rope_theta": 10000.0}
NEGATIVE_BASE = {"rope_type": "default", "rope_theta": -5}
BAD = [
    ("mixtral", dict(num_experts_per_tok=99), "num_experts_per_tok=99", "choose an integer 1..4"),
    ("mixtral", dict(num_experts_per_tok=-1), "num_experts_per_tok=-1", "choose an integer 1..4"),
    ("mixtral", dict(sliding_window=0), "sliding_window=0", "choose an integer 1..16,777,216 or null for no window"),
    ("llama", dict(sliding_window=0), "sliding_window=0", "choose an integer 1..16,777,216 or null for no window"),
    ("phi3", dict(partial_rotary_factor=7), "partial_rotary_factor=7", "choose a number in (0, 1]"),
    ("llama", dict(partial_rotary_factor=0), "partial_rotary_factor=0", "choose a number in (0, 1]"),
    ("llama", dict(num_hidden_layers=0), "num_hidden_layers=0", "choose an integer 1..1,024"),
    ("llama", dict(model_type=["llama"]), "model_type=['llama']", "choose a string"),
    ("llama", dict(num_attention_heads=0), "num_attention_heads=0", "choose an integer 1..16,384"),
    ("llama", dict(num_key_value_heads=0), "num_key_value_heads=0", "choose an integer 1..16,384"),
    ("llama", dict(head_dim=0), "head_dim=0", "choose an integer 1..1,048,576"),
    ("gemma2", dict(query_pre_attn_scalar=0), "query_pre_attn_scalar=0", "choose a number > 0"),
    ("llama", dict(hidden_size=[16, 16]), "hidden_size=[16, 16]", "choose an integer 1..1,048,576"),
    ("llama", dict(num_key_value_heads=[2]), "num_key_value_heads=[2]", "choose an integer 1..16,384"),
    ("llama", dict(rope_theta=0), "rope_theta=0", "choose a number > 0"),
    ("llama", dict(rope_parameters=NEGATIVE_BASE), "rope_parameters.rope_theta=-5", "choose a number > 0"),
    ("llama", dict(rms_norm_eps=-1e-5), "rms_norm_eps=-1e-05", "choose a number in [0, 1]"),
    ("gpt2", dict(layer_norm_epsilon=-1e-5), "layer_norm_epsilon=-1e-05", "choose a number in [0, 1]"),
    ("llama", dict(rope_scaling=ROPE), "rope_scaling.factor=0", "choose a number > 0"),
    ("llama", dict(rope_parameters=ROPE), "rope_parameters.factor=0", "choose a number > 0"),
]


@pytest.mark.parametrize("model_type, config, says, choose", BAD, ids=[b[2] for b in BAD])
def test_a_config_value_out_of_range_is_one_line(tmp_path, saved, capsys, model_type, config, says, choose):
    """Each was an internal error (a top-k past the experts, a division by a zero head count, KeyError 'layer' for no
    layers, an unhashable model_type), NaN everywhere (a zero rope factor) or silently other numbers (a zero or
    negative rotary base, a negative norm epsilon)."""
    folder = edited(saved(model_type), tmp_path / "m", **config)
    line = assert_one_line_error(run_sinks(folder, tmp_path / "out", capsys), says, choose)
    assert f"config {says} is not " in line, line


def test_sliding_window_zero_is_accepted_where_the_window_is_off():
    """Qwen2-MoE's defaults state sliding_window 0 with use_sliding_window false: the window is unused."""
    check_config({"model_type": "qwen2_moe", "use_sliding_window": False, "sliding_window": 0}, "m")
    with pytest.raises(CheckpointSizeError, match=r"config sliding_window=0 is not a context size"):
        check_config({"model_type": "qwen2_moe", "use_sliding_window": True, "sliding_window": 0}, "m")
    check_config({"sliding_window": None}, "m")


@pytest.mark.parametrize(
    "config, says",
    [
        ({"text_config": {"num_experts": 8, "num_experts_per_tok": 9}}, "text_config.num_experts_per_tok=9"),
        ({"n_routed_experts": 4, "num_experts_per_tok": 0}, "num_experts_per_tok=0"),
        ({"rope_parameters": {"full_attention": {"rope_theta": 0}}}, "rope_parameters.full_attention.rope_theta=0"),
        ({"norm_eps": float("nan")}, "norm_eps=nan"),
        ({"layer_norm_eps": True}, "layer_norm_eps=True"),
        ({"num_local_experts": 0}, "num_local_experts=0"),
        ({"n_layers": 2.5}, "n_layers=2.5"),
    ],
)
def test_the_table_reaches_nested_configs_and_odd_values(config, says):
    with pytest.raises(CheckpointSizeError, match=rf"^m: config {__import__('re').escape(says)} is not .*; choose "):
        check_config(config, "m")


def test_every_key_of_the_table_has_a_kind_and_a_range():
    assert set(RANGES) >= {k for keys in SIZE_KEYS.values() for k in keys}
    for key, r in RANGES.items():
        assert r.kind in ("integer", "number", "string"), key
        assert r.kind == "string" or r.low is not None, key
        assert r.choose().startswith(("an integer", "a number", "a string")), key


def test_every_tiny_config_of_the_coverage_suite_is_within_the_table():
    """The coverage suite builds every causal-LM model_type from a tiny config: none may be refused by the table."""
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from probe.checkpoints import architectures
    from probe.checkpoints.tiny import FAMILIES, more_tiny_config, tiny_config
    from probe.checkpoints.tiny_configs import auto_tiny_config

    refused = {t for t, r in architectures.table()["types"].items() if r["status"] == "refused"}
    configs = {f"probe-tiny:{f}": (tiny_config(f) if f in FAMILIES[:3] else more_tiny_config(f)) for f in FAMILIES}
    for model_type in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        if model_type in refused:
            continue
        try:
            configs[model_type] = auto_tiny_config(model_type)
            configs[f"default:{model_type}"] = CONFIG_MAPPING[model_type]()
        except Exception:  # noqa: BLE001 - a type whose tiny config cannot be made is not in the coverage suite
            continue
    problems = {k: config_problem(json.loads(c.to_json_string())) for k, c in configs.items()}
    assert len(configs) > 50
    assert not {k: p for k, p in problems.items() if p}


def test_probe_and_the_authors_configs_are_within_the_table():
    folders = [p.parent for p in ZOO.glob("*/config.json")] + [AUTHORS / "muddformer-checkpoint" / "checkpoint"]
    for folder in folders:
        check_config(json.loads((folder / "config.json").read_text()), str(folder))
    lr = torch.load(AUTHORS / "lr-attnres-block-checkpoint" / "final_model.pt", weights_only=True)["model_args"]
    check_config(lr, "lr", "model_args")
