"""What ``probe.load`` and the CLI say when a load goes wrong: a bad dtype, a tokenizer that is missing, unreadable or
failing for another reason, a checkpoint whose tensors do not fit its config (transformers' load report reduced to one
line), a damaged revisions table, and revision errors without a model-name suggestion after them."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

import pytest
from safetensors.torch import load_file, save_file

import probe
import probe.checkpoints.load as L
from probe.checkpoints.tiny import build_tiny
from tests.support.cli import ENV, REPO, assert_one_line_error
from tests.support.cli import probe as run_probe

WINDOWS = ["--batches", "1", "--batch-size", "1", "--ctx", "8"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny("olmo2", tmp_path_factory.mktemp("tiny") / "olmo2")


def _copy(src, dst, edit=None):
    """A copy of the checkpoint folder ``src`` with its tensors passed through ``edit(state_dict)``."""
    shutil.copytree(src, dst)
    if edit is not None:
        sd = load_file(dst / "model.safetensors")
        edit(sd)
        save_file(sd, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def _transpose_up_proj(sd):
    for k in list(sd):
        if k.endswith("mlp.up_proj.weight"):
            sd[k] = sd[k].t().contiguous()


# ---------------------------------------------------------------------------------------------------- dtype


@pytest.mark.parametrize("dtype", ["float33", "Tensor", "int8", 3])
def test_a_bad_dtype_is_one_line_naming_it_and_the_choices_before_anything_loads(tiny, monkeypatch, dtype):
    def no_resolving(*a, **k):
        raise AssertionError("the name was resolved before the dtype was checked")

    monkeypatch.setattr(L, "resolve", no_resolving)
    with pytest.raises(ValueError) as e:
        probe.load(tiny, dtype=dtype)
    msg = str(e.value)
    assert "\n" not in msg and repr(dtype) in msg and "tokenizer" not in msg
    for choice in ("float32", "float16", "bfloat16", "float64", "auto", "fp32", "fp16", "half", "bf16"):
        assert choice in msg


@pytest.mark.parametrize("dtype", ["float32", "fp32", "bf16", "half", "auto", None])
def test_valid_dtypes_pass_the_check(dtype):
    assert L.check_dtype(dtype) == dtype


# ---------------------------------------------------------------------------------------------------- tokenizer


def test_a_tokenizer_failing_for_another_reason_is_not_reported_as_no_tokenizer(tiny, monkeypatch):
    import transformers

    def broken(*a, **k):
        raise RuntimeError("a bug in the tokenizer class, not a missing file")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", broken)
    monkeypatch.setattr(transformers.PreTrainedTokenizerFast, "from_pretrained", broken)
    with pytest.raises(RuntimeError, match="a bug in the tokenizer class"):
        L._load_tokenizer(str(tiny))


def test_a_folder_without_tokenizer_files_ships_none(tiny, tmp_path):
    folder = _copy(tiny, tmp_path / "notok")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (folder / f).unlink()
    assert L._read_tokenizer(str(folder)) == (None, "ships no tokenizer")
    assert probe.load(folder).tokenizer is None


def test_an_unreadable_tokenizer_is_named_as_such(tiny, tmp_path):
    folder = _copy(tiny, tmp_path / "badtok")
    (folder / "tokenizer.json").write_text("{not json")
    model = probe.load(folder)
    assert model.tokenizer is None and model.tokenizer_problem.startswith("ships a tokenizer that cannot be read")
    r = run_probe("sinks", "--model", folder, "--out", tmp_path / "out", *WINDOWS)
    assert_one_line_error(r, "ships a tokenizer that cannot be read", "--tokenizer")


# ---------------------------------------------------------------------------------------------------- load report


def test_shapes_that_differ_from_the_config_are_one_line_and_no_report(tiny, tmp_path, capfd):
    folder = _copy(tiny, tmp_path / "mismatch", _transpose_up_proj)
    with pytest.raises(L.CheckpointMismatchError) as e:
        probe.load(folder)
    msg = str(e.value)
    assert "\n" not in msg
    assert "2 tensors do not match the config" in msg
    assert "model.layers.0.mlp.up_proj.weight: stored (32, 64), config wants (64, 32)" in msg
    assert capfd.readouterr().err == ""  # transformers' LOAD REPORT table is not printed


def test_a_missing_tensor_is_one_line_not_a_random_initialisation(tiny, tmp_path, capfd):
    def rename(sd):  # the same number of stored values (the size check passes), under a name the model lacks
        sd["model.layers.0.mlp.up_proj.renamed"] = sd.pop("model.layers.0.mlp.up_proj.weight")

    folder = _copy(tiny, tmp_path / "missing", rename)
    with pytest.raises(L.CheckpointMismatchError, match=r"1 tensor the config needs is not stored \(model.layers.0"):
        probe.load(folder)
    assert capfd.readouterr().err == ""


def test_the_cli_prints_only_probes_line_for_a_mismatched_checkpoint(tiny, tmp_path):
    folder = _copy(tiny, tmp_path / "mismatch", _transpose_up_proj)
    r = run_probe("sinks", "--model", folder, "--out", tmp_path / "out", *WINDOWS)
    line = assert_one_line_error(r, "do not match the config", "stored (32, 64), config wants (64, 32)")
    assert "LOAD REPORT" not in r.stderr and "ignore_mismatched_sizes" not in line


# ---------------------------------------------------------------------------------------------------- revisions


def _python(code: str) -> subprocess.CompletedProcess:
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=ENV, cwd=REPO, timeout=600
    )
    return r


DAMAGED = """
    import pathlib, sys
    _read = pathlib.Path.read_text

    def read_text(self, *a, **k):  # probe's revisions.json, damaged
        if self.name == "revisions.json":
            return '{"repos": {broken'
        return _read(self, *a, **k)

    pathlib.Path.read_text = read_text
    import probe.checkpoints.load as L
    from probe.cli.main import main
"""


def test_a_damaged_revisions_table_leaves_other_names_and_probe_models_working():
    r = _python(
        DAMAGED
        + """
    assert L.resolve("pythia-14m@step1000") == ("EleutherAI/pythia-14m", "step1000", "hub")
    assert L.resolve("org/name")[2] == "hub"
    sys.exit(main(["models"]))
    """
    )
    assert r.returncode == 0, r.stderr
    assert "pythia-14m" in r.stdout and "olmo-2-0425-1b" not in r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "revisions.json" in lines[0] and "reinstall probe-attn" in lines[0]


def test_a_damaged_revisions_table_is_one_line_where_a_suite_needs_it():
    run = '\n    sys.exit(main(["sinks", "--model", "olmo-2-0425-1b@step1000", "--out", "/nonexistent/x"]))\n'
    r = _python(DAMAGED + run)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "revisions.json" in lines[0] and "reinstall probe-attn" in lines[0] and "did you mean" not in lines[0]


def test_the_table_is_read_from_revisions_file_when_first_needed(tmp_path, monkeypatch):
    damaged = tmp_path / "revisions.json"
    damaged.write_text("[1, 2")
    monkeypatch.setattr(L, "REVISIONS_FILE", damaged)
    assert L.resolve("pythia-70m")[0] == "EleutherAI/pythia-70m"
    with pytest.raises(L.RevisionError, match="reinstall probe-attn") as e:
        L.resolve("olmo-2-1124-7b@step1000")
    assert str(damaged) in str(e.value) and "\n" not in str(e.value)
    assert "olmo-2-1124-7b" not in L.KNOWN_CHECKPOINTS and "pythia-70m" in L.KNOWN_CHECKPOINTS


@pytest.mark.parametrize(
    "name, needle",
    [
        ("pythia-14m@stepXYZ", "Pythia has no revision 'stepXYZ'"),
        ("pythia-14m@step12345", "Pythia has no checkpoint at step 12345"),
        ("EleutherAI/pythia-14m@../x", "revision '../x' is not a branch"),
        ("olmo-2-0425-1b@step12345", "no checkpoint at step 12345"),
    ],
)
def test_a_revision_error_is_the_loaders_line_without_a_name_suggestion(name, needle, tmp_path, monkeypatch, capsys):
    from probe.cli.main import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code = main(["sinks", "--model", name, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert needle in err and "did you mean" not in err and "probe models" not in err
