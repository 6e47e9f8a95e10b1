"""Fixtures of the report tests (tests/jobs/test_report_shards.py, tests/jobs/test_report_ctx.py)."""

from __future__ import annotations

import subprocess

import pytest


@pytest.fixture
def cli(capsys, monkeypatch):
    """``probe ARGS`` in this process, as a CompletedProcess (exit code, stdout, stderr)."""
    from probe.cli import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def run(*args):
        code = main([str(a) for a in args])
        return subprocess.CompletedProcess(args, code, *capsys.readouterr())

    return run
