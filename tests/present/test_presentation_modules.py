"""Each analysis's presentation lives in its own module (probe.present.<analysis>): its figures, page sections,
terminal text and the descriptions of its own files; probe.present.page keeps the one page skeleton and asks the
modules in DESCRIBED_BY for their descriptions."""

from __future__ import annotations

from importlib import import_module
from pathlib import Path

import pytest

from probe.present import page

GOLDEN = Path(__file__).resolve().parents[1] / "jobs" / "golden"
VERB_PRESENTATIONS = ("sinks", "inject", "gates", "sources", "eval", "costs", "viewers")  # published by files.publish


def test_no_file_is_described_by_two_modules_and_the_skeleton_describes_only_its_own():
    seen = {}
    for name in page.DESCRIBED_BY:
        for file in import_module(name).DESCRIPTIONS:
            assert file not in seen, f"{file} described by {seen.get(file)} and {name}"
            seen[file] = name
    assert set(page.DESCRIPTIONS) == {page.INDEX, page.PLOTLY_JS}
    assert set(page.descriptions()) == set(seen) | set(page.DESCRIPTIONS)


def test_each_verbs_files_are_described_by_its_own_module():
    owner = {file: name for name in page.DESCRIBED_BY for file in import_module(name).DESCRIPTIONS}
    for verb in ("sinks", "inject", "gates", "eval", "costs", "models", "view"):
        own = [f for f, name in owner.items() if f.split("_")[0].split(".")[0] == verb]
        assert own and all(
            owner[f].startswith(
                ("probe.present." + verb, "probe.present.sink_eps", "probe.present.massive", "probe.present.dormant")
            )
            for f in own
        ), verb
    assert owner["manifest.json"] == "probe.present.report" and owner["config.json"] == "probe.present.recipe"


def _one_file_per_name() -> list[Path]:
    """One golden output file of each name (every verb's CSVs and JSON on the zoo)."""
    files = {}
    for p in sorted(GOLDEN.rglob("*")):
        if p.suffix in (".csv", ".json") and p.name != "cases.json":
            files.setdefault(p.name, p)
    return list(files.values())


@pytest.mark.parametrize("path", _one_file_per_name(), ids=lambda p: p.name)
def test_every_golden_output_file_has_a_line_in_the_index(path):
    line = page.describe(path)
    known = page.descriptions()
    assert line == known[path.name] if path.name in known else line
    assert "\n" not in line


@pytest.mark.parametrize("name", VERB_PRESENTATIONS)
def test_an_analysis_presentation_module_has_the_published_parts(name):
    module = import_module(f"probe.present.{name}")
    assert isinstance(module.TITLE, str) and module.TITLE
    for part in ("figures", "sections", "text"):
        assert callable(getattr(module, part)), (name, part)


def test_the_index_reads_the_descriptions_without_importing_the_analyses():
    """A folder's index (written by every verb, `probe costs --out` and `probe models --out` too) reads the modules'
    literal DESCRIPTIONS from their source: no torch import; the same lines as the imported modules give."""
    import json
    import subprocess
    import sys

    code = (
        "import json, sys\nfrom probe.present import page\nd = page.descriptions()\n"
        "print(json.dumps([d, 'torch' in sys.modules]))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    read, torch_imported = json.loads(r.stdout)
    assert not torch_imported
    for name in page.DESCRIBED_BY:
        import_module(name)
    assert read == page.descriptions()
