"""An integer or bool weight in a checkpoint whose config declares no quantisation (no quantization_config) is one
line naming the file, the tensor and its dtype, instead of being cast to floats and used; the integer buffers some
models save (probe.checkpoints.sizes.INTEGER_BUFFERS) and quantised checkpoints pass."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from probe.checkpoints.sizes import CheckpointSizeError, check_integer_tensors
from tests.support.cli import assert_one_line_error
from tests.support.verbs import WINDOWS, save_tiny

WEIGHT = "model.layers.0.mlp.down_proj.weight"


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return save_tiny("llama", tmp_path_factory.mktemp("llama") / "m")


def with_tensors(src: Path, dst: Path, **replace) -> Path:
    shutil.copytree(src, dst)
    state = load_file(dst / "model.safetensors")
    state.update(replace)
    save_file(state, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def run_sinks(folder: Path, out: Path, capsys) -> subprocess.CompletedProcess:
    from probe.cli.main import main

    capsys.readouterr()  # what saving the folder printed
    code = main(["sinks", "--model", str(folder), *WINDOWS, "--out", str(out), "--quiet"])
    return subprocess.CompletedProcess([], code, *capsys.readouterr())


@pytest.mark.parametrize(
    "dtype, shown",
    [(torch.int8, "I8"), (torch.uint8, "U8"), (torch.int32, "I32"), (torch.int64, "I64"), (torch.bool, "BOOL")],
)
def test_an_integer_weight_without_quantisation_is_one_line(tmp_path, llama, capsys, dtype, shown):
    """An int8 down_proj in a float llama loaded with exit code 0: cast to floats, other numbers."""
    weight = load_file(llama / "model.safetensors")[WEIGHT]
    folder = with_tensors(llama, tmp_path / "m", **{WEIGHT: (weight * 100).to(dtype)})
    assert_one_line_error(
        run_sinks(folder, tmp_path / "out", capsys),
        f"model.safetensors holds tensor {WEIGHT} as {shown}",
        "its config declares no quantisation (no quantization_config), so probe will not cast it",
    )


@pytest.mark.parametrize(
    "name, dtype",
    [
        ("model.position_ids", "I64"),
        ("model.norm.num_batches_tracked", "I64"),
        ("model.layers.0.attn.bias", "BOOL"),
        ("model.layers.0.attn.masked_bias", "U8"),
        ("model.layers.0.ffn.gate.tid2eid", "I64"),
    ],
)
def test_known_integer_buffers_pass(tmp_path, name, dtype):
    path = tmp_path / "model.safetensors"
    torch_dtype = {"I64": torch.int64, "BOOL": torch.bool, "U8": torch.uint8}[dtype]
    save_file({name: torch.zeros(3, dtype=torch_dtype), "model.w": torch.zeros(3)}, path)
    check_integer_tensors({"model_type": "llama"}, [path], "m")


def test_a_bias_that_is_not_a_mask_is_refused(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file({"model.layers.0.mlp.bias": torch.zeros(3, dtype=torch.int8)}, path)
    with pytest.raises(CheckpointSizeError, match=r"tensor model.layers.0.mlp.bias as I8"):
        check_integer_tensors({"model_type": "llama"}, [path], "m")


def test_a_declared_quantisation_passes(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file({WEIGHT: torch.zeros(3, dtype=torch.int8)}, path)
    check_integer_tensors({"quantization_config": {"quant_method": "bitsandbytes"}}, [path], "m")
    with pytest.raises(CheckpointSizeError, match="declares no quantisation"):
        check_integer_tensors({"quantization_config": None}, [path], "m")


def test_a_float_checkpoint_still_loads(tmp_path, llama, capsys):
    folder = with_tensors(llama, tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in cfg
    r = run_sinks(folder, tmp_path / "out", capsys)
    assert r.returncode == 0, r.stderr
