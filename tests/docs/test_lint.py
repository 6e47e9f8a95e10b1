"""Lint and format of the whole tree, as pyproject.toml's [tool.ruff] configures them (line length 120; rules E, F, I,
B, UP; B905 and the notebooks' per-section imports excepted, with why). The same two commands as scripts/ci/lint.sh;
`ruff check --fix` and `ruff format` are the author's, before committing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("command", [["check", "."], ["format", "--check", "."]], ids=["check", "format"])
def test_the_tree_passes_ruff(command):
    run = subprocess.run(
        [sys.executable, "-m", "ruff", *command], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, f"ruff {' '.join(command)} found:\n{run.stdout[-4000:]}{run.stderr[-2000:]}"
