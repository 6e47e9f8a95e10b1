"""The errors a newcomer meets first: a model name that cannot load fails before torch is imported and says how to
get the model in the installed huggingface-hub's words and the command line's (``--model PATH``); an unknown verb gets
a "did you mean"; ``probe report --help`` says what its page needs; the files line counts what was written."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys

import pytest

from tests.support.cli import ENV, WINDOWS, assert_one_line_error, files_under, probe

# the CLI in a fresh interpreter: its exit status, and whether torch was imported by the time it returned
BEFORE_TORCH = "\n".join(
    [
        "import sys",
        "from probe.cli.main import main",
        "rc = main(sys.argv[1:])",
        "print(rc, 'torch' in sys.modules)",
        "sys.exit(rc)",
    ]
)


def before_torch(argv, env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", BEFORE_TORCH, *argv], capture_output=True, text=True, env={**ENV, **env}, timeout=120
    )


@pytest.fixture()
def empty_cache(tmp_path):
    """Offline with an empty hub cache: every hub name is missing, whatever the machine has cached."""
    return {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HOME": str(tmp_path / "hf")}


def test_the_installed_hub_ships_hf_download():
    """The command the errors name is the installed huggingface-hub's own (its 1.x CLI is `hf`, without
    `huggingface-cli`)."""
    scripts = {e.name: e.dist.name for e in importlib.metadata.entry_points(group="console_scripts")}
    assert scripts.get("hf") == "huggingface_hub"
    assert "huggingface-cli" not in scripts


@pytest.mark.parametrize(
    "argv, needles",
    [
        (
            ["sinks", "--model", "pythia-410m"],
            ["`hf download EleutherAI/pythia-410m --local-dir pythia-410m`", "--model path/to/pythia-410m"],
        ),
        (
            ["inject", "--model", "pythia-160m@step1000"],
            ["`hf download EleutherAI/pythia-160m --revision step1000 --local-dir pythia-160m`", "--model path/to"],
        ),
        (["sinks", "--model", "pythia-41m"], ["did you mean pythia-410m?", "--model path/to/pythia-41m"]),
        (["eval", "--model", "probe/tiny-nope"], ["no zoo checkpoint 'tiny-nope'", "tiny-baseline"]),
        (["sources", "--model", "./no/such/dir"], ["no model directory at ./no/such/dir"]),
        (["gates", "--model", "missing.gguf"], ["GGUF file not found", "--model file.gguf"]),
        (["sinks", "--model", "pythia-70m@step1500"], ["no checkpoint at step 1500"]),
    ],
)
def test_a_model_that_cannot_load_fails_before_torch(argv, needles, empty_cache):
    """One line, exit 2, the CLI's form (never Python's probe.load), and torch never imported."""
    r = before_torch(argv, empty_cache)
    assert r.stdout.split() == ["2", "False"], r.stderr
    assert_one_line_error(r, *needles)
    assert "probe.load" not in r.stderr and "huggingface-cli" not in r.stderr


def test_python_says_probe_load_and_the_command_line_says_the_flag(empty_cache, monkeypatch):
    from probe.checkpoints import load as L

    for k, v in empty_cache.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", empty_cache["HF_HUB_CACHE"])
    with pytest.raises(L.ModelNotFoundError) as e:
        L.check_available("gpt-oss-20b")
    assert "`hf download openai/gpt-oss-20b --local-dir gpt-oss-20b`" in str(e.value)
    assert "probe.load('path/to/gpt-oss-20b')" in str(e.value) and "--model" not in str(e.value)
    assert e.value.on_command_line("--models").endswith("--models path/to/gpt-oss-20b")


def test_report_checks_its_names_before_torch(empty_cache, tmp_path):
    argv = ["report", "--models", "probe/tiny-baseline", "probe/tiny-nope", "--out", str(tmp_path / "r")]
    r = before_torch(argv, empty_cache)
    assert r.stdout.split() == ["2", "False"], r.stderr
    assert_one_line_error(r, "--models/--checkpoints 'probe/tiny-nope'", "no zoo checkpoint")
    assert files_under(tmp_path / "r") == []


@pytest.mark.parametrize(
    "verb, close", [("sink", "sinks"), ("injct", "inject"), ("gate", "gates"), ("repot", "report"), ("xyzzy", None)]
)
def test_unknown_verb_says_did_you_mean(verb, close):
    r = probe(verb, "--model", "probe/tiny-baseline")
    needles = [f"unknown verb {verb!r}", "choose one of models, inject"]
    assert_one_line_error(r, *needles, *([f"did you mean {close}?"] if close else []))
    assert close is not None or "did you mean" not in r.stderr


def test_report_help_says_what_its_page_needs():
    text = " ".join(probe("report", "--help").stdout.split())
    assert "self-contained offline HTML report" not in text
    assert (
        "loads the plotly.min.js written beside it" in text and "--self-contained for a page that works alone" in text
    )


@pytest.mark.parametrize("verb", ["sinks", "inject", "eval"])
def test_a_verbs_out_help_says_what_its_page_needs(verb):
    text = re.sub(r"-\s+", "-", " ".join(probe(verb, "--help").stdout.split()))  # argparse wraps at hyphens
    assert "loads the plotly.min.js written beside it" in text
    assert "--self-contained for a page that works alone" in text


def test_the_files_line_counts_every_file_written(tmp_path):
    out = tmp_path / "s"
    r = probe("sinks", "--model", "probe/tiny-baseline", *WINDOWS, "--out", out)
    assert r.returncode == 0, r.stderr
    said = re.search(r"wrote (\d+) files to \S+: (.*)", r.stderr)
    on_disk = sorted(p.name for p in files_under(out))
    assert said and int(said.group(1)) == len(on_disk) and "index.html" in on_disk
    assert sorted(said.group(2).strip().split(", ")) == on_disk
