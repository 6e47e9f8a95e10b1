"""--quiet is silent on success for a model loaded from the Hugging Face cache (transformers' "Loading weights" bar
included), and `probe report`'s error for a non-finite model suggests only flags `probe report` has."""

from __future__ import annotations

import shutil

import pytest
from safetensors.torch import load_file, save_file

from probe.checkpoints.tiny import build_tiny
from tests.support.cli import assert_one_line_error, probe

WINDOWS = ["--batches", "1", "--batch-size", "1", "--ctx", "8"]
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny("olmo2", tmp_path_factory.mktemp("tiny") / "olmo2")


def test_quiet_is_silent_for_a_model_from_the_hub_cache(tiny, tmp_path):
    cache = tmp_path / "hub"
    repo = cache / "models--org--name"
    shutil.copytree(tiny, repo / "snapshots" / COMMIT)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    env = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    r = probe("sinks", "--model", "org/name", "--quiet", "--out", tmp_path / "out", *WINDOWS, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    loud = probe("sinks", "--model", "org/name", "--out", tmp_path / "out2", *WINDOWS, env=env)
    assert loud.returncode == 0 and "plan: sinks on org/name" in loud.stderr  # without --quiet the notes are there


def test_reports_nonfinite_error_suggests_no_flag_report_lacks(tiny, tmp_path):
    folder = tmp_path / "nan"
    shutil.copytree(tiny, folder)
    sd = load_file(folder / "model.safetensors")
    key = next(k for k in sorted(sd) if k.endswith("q_proj.weight"))
    sd[key].fill_(float("nan"))
    save_file(sd, folder / "model.safetensors", metadata={"format": "pt"})
    r = probe("report", "--models", folder, "--out", tmp_path / "out", "--quiet", *WINDOWS)
    line = assert_one_line_error(r, "non-finite values", "no verdict")
    assert "--allow-nonfinite" not in line
    sinks = probe("sinks", "--model", folder, "--out", tmp_path / "out2", "--quiet", *WINDOWS)
    assert "--allow-nonfinite" in assert_one_line_error(sinks, "non-finite values")  # sinks has the flag


def test_a_hub_models_config_is_range_checked_too(tiny, tmp_path):
    import json

    cache = tmp_path / "hub"
    snapshot = cache / "models--org--bad" / "snapshots" / COMMIT
    shutil.copytree(tiny, snapshot)
    (cache / "models--org--bad" / "refs").mkdir()
    (cache / "models--org--bad" / "refs" / "main").write_text(COMMIT)
    config = json.loads((snapshot / "config.json").read_text())
    config["num_attention_heads"] = 0
    (snapshot / "config.json").write_text(json.dumps(config))
    env = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    r = probe("sinks", "--model", "org/bad", "--quiet", *WINDOWS, env=env)
    assert "num_attention_heads=0" in assert_one_line_error(r, "num_attention_heads")
