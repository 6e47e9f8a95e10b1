"""The tests' forked `probe` command (tests/support/forked_cli.py) is the cold one: same exit codes, same stdout and
stderr, its own working directory and process, and a timeout that ends only the command it was given."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support import forked_cli
from tests.support.cli import ENV, WINDOWS


def cold(*args, cwd=None) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "probe.cli", *args]
    return subprocess.run(argv, capture_output=True, env=ENV, cwd=cwd, timeout=600)


def forked(*args, cwd=None, timeout=600) -> subprocess.CompletedProcess:
    return forked_cli.run_forked(list(args), ENV, None if cwd is None else str(cwd), timeout)


@pytest.mark.parametrize(
    "argv",
    [["--version"], ["sink"], ["sinks", "--batches", "0"], ["sinks", "--model", "no/such-model", "--quiet"]],
    ids=["version", "unknown verb", "bad flag", "missing model"],
)
def test_a_forked_command_exits_and_prints_as_a_cold_one(argv):
    want, got = cold(*argv), forked(*argv)
    assert (got.returncode, got.stdout, got.stderr) == (want.returncode, want.stdout, want.stderr)


def test_a_forked_run_writes_what_a_cold_run_writes_in_its_own_folder(tmp_path):
    """Relative paths are the command's working directory's; the tables are the same numbers."""
    args = ["sinks", *WINDOWS, "--json", "--quiet", "--out", "out"]
    (tmp_path / "cold").mkdir()
    (tmp_path / "forked").mkdir()
    want, got = cold(*args, cwd=tmp_path / "cold"), forked(*args, cwd=tmp_path / "forked")
    assert want.returncode == got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["tables"] == json.loads(want.stdout)["tables"]
    assert got.stderr == want.stderr == b""
    written = sorted(p.name for p in (tmp_path / "forked" / "out").iterdir())
    assert written == sorted(p.name for p in (tmp_path / "cold" / "out").iterdir()) and "sinks.json" in written


def test_each_command_is_a_new_process_and_a_timeout_ends_only_it():
    runs = [forked("costs", "--json", "--quiet") for _ in range(2)]
    assert [r.returncode for r in runs] == [0, 0], runs[-1].stderr
    zygote = forked_cli._zygote[0].process.pid
    assert len({runs[0].pid, runs[1].pid, zygote, os.getpid()}) == 4  # two children of one zygote
    with pytest.raises(subprocess.TimeoutExpired):
        forked("sinks", *WINDOWS, "--quiet", timeout=0.05)
    r = forked("--version")
    assert r.returncode == 0 and r.stdout.startswith(b"probe ") and forked_cli._zygote[0].process.pid == zygote
