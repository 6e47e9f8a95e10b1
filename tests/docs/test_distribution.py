"""The distribution is ``probe-attn`` (``probe`` on PyPI is an unrelated 2013 package): every install hint and
self-reference names it, the version has one source (``probe.__version__``, which pyproject.toml reads), and the
changelog starts with that version."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

import probe

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[2]
DIST = "probe-attn"
# 'probe[extra]' or 'pip install probe' without the distribution's suffix: pip would fetch the unrelated package
STALE = re.compile(r"(?<![\w./-])probe\[|pip install +['\"]?probe(?![\w-])")


def tracked_text_files() -> list[Path]:
    names = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    keep = {".py", ".md", ".toml", ".sh", ".ipynb", ".yml", ".yaml", ".txt", ".cfg"}
    return [
        ROOT / n
        for n in names
        if Path(n).suffix in keep and not n.startswith("probe/data/corpora") and (ROOT / n).is_file()
    ]


def test_no_install_hint_names_the_unrelated_package():
    this = Path(__file__).resolve()
    found = [
        f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
        for p in tracked_text_files()
        if p != this
        for n, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
        if STALE.search(line)
    ]
    assert not found, f"install hints must name {DIST}:\n" + "\n".join(found)


def test_the_stale_hint_pattern_catches_the_old_hints():
    old = ["pip install 'probe[gemma]'", "pip install probe[gpt2]", "pip install probe", '"probe[gemma]"']
    assert all(STALE.search(s) for s in old)
    ok = [
        "pip install 'probe-attn[gemma]'",
        "pip install -e .",
        "probe-attn[dev]",
        "pip install probe-attn",
        "self.probe[key]",
    ]
    assert not any(STALE.search(s) for s in ok)


def test_one_version_source_and_the_changelog_starts_with_it():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["name"] == DIST
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "probe.__version__"}
    assert all(
        r.startswith(f"{DIST}[")
        for r in project["project"]["optional-dependencies"]["dev"]
        if r.split("[")[0] in ("probe", DIST)
    )
    first = next(line for line in (ROOT / "CHANGELOG.md").read_text().splitlines() if line.startswith("## "))
    assert first.split()[1] == probe.__version__, first
