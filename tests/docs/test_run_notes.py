"""The run notes (``<!-- copied from a run; settings: ...; wall: ...; memory: ... -->``) agree across the README and the
site: the same command or output, copied in several places (the main job's command, the tests' command, Gemma's
output), carries the same note everywhere, so a fresh measurement updates all of them or the test fails. The CI note
names a commit, and the getting-started page and the README quote the same .ci/run."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

from tests.support.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*.md")) + ["README.md"]


def _site():
    return load_script("scripts/docs/site.py", "probe_docs_site")


def _notes_by_block() -> dict[str, dict[str, str]]:
    site, found = _site(), defaultdict(dict)
    for page in PAGES:
        for block in site.code_blocks((ROOT / page).read_text(encoding="utf-8")):
            if block["mark"] == "copied":
                found[block["text"].strip()][f"{page}:{block['line']}"] = block["detail"]
    return found


def test_a_block_copied_in_several_places_has_one_note():
    differ = {
        text[:80]: where for text, where in _notes_by_block().items() if len(where) > 1 and len(set(where.values())) > 1
    }
    assert not differ, "the same block carries different run notes:\n" + "\n".join(
        f"{text!r}:\n" + "\n".join(f"  {w}: {n}" for w, n in where.items()) for text, where in differ.items()
    )


def test_the_main_job_and_the_tests_are_noted_alike_in_the_readme_and_on_the_site():
    notes = _notes_by_block()
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    first, second = [b["text"].strip() for b in _site().code_blocks(readme)[:2]]
    assert {w.split(":")[0] for w in notes[first]} >= {"README.md", "docs/getting-started.md", "docs/index.md"}
    assert {w.split(":")[0] for w in notes[second]} >= {"README.md", "docs/getting-started.md"}
    (ci,) = set(notes[second].values())
    assert re.search(r"\.ci/run on a fresh clone of [0-9a-f]{7,}", ci) and re.search(r"wall: \d+ min", ci), ci
