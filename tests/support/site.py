"""The documentation site, built once per test session (``mkdocs build --strict``; the build executes the notebooks and
draws the pages' figures, a minute or more): the test files that read it (tests/docs/test_site.py,
tests/docs/test_pages.py, tests/test_notebooks.py) share one build, also across pytest-xdist workers (the first
worker to ask builds under a lock in the session's shared temporary folder; the others wait and read it)."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def built_site(tmp_path_factory) -> Path:
    """The built site's folder; a failed build fails every test that asks, with MkDocs' own last lines."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    pytest.importorskip("mkdocstrings_handlers.python")
    pytest.importorskip("nbclient")
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # one folder per session either way
    out, failed = shared / "probe-site", shared / "probe-site.failed"
    with open(shared / "probe-site.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "index.html").is_file() and not failed.is_file():
            env = {k: v for k, v in os.environ.items() if k != "PROBE_DOCS_CACHE"}  # made afresh, never from a cache
            run = subprocess.run(
                [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                cwd=ROOT,
                capture_output=True,
                text=True,
                env={**env, "NO_MKDOCS_2_WARNING": "1"},
            )
            if run.returncode != 0:
                failed.write_text(run.stderr[-6000:] or run.stdout[-6000:], encoding="utf-8")
    if failed.is_file():
        pytest.fail("mkdocs build --strict failed:\n" + failed.read_text(encoding="utf-8"))
    return out
