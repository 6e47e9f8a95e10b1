"""The notebooks in notebooks/ are committed without outputs and execute top to bottom (nbclient, what `jupyter
nbconvert --execute` runs) without an error, a warning or anything else on stderr, without a progress-bar widget in
a cell, and with model names, not temporary folders, in their figures' titles; every plotly figure also carries a
PNG (so it shows on GitHub) when a Chromium is there for kaleido — always under CI (PROBE_REQUIRE_BROWSER=1).

They are executed once, by the documentation build that renders them as the site's tutorials (tests/support/site.py:
one build per session); these tests read the executed copies the build leaves beside the pages. In a venv with only
``probe-attn[notebook]`` they are executed again by scripts/ci/wheel_test.sh, with the same checks."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.support.scripts import load_script

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
HAVE_BROWSER = any(shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome", "chrome"))


def _checks():
    return load_script("scripts/docs/notebooks.py", "probe_docs_notebooks")


@pytest.fixture(scope="module")
def executed(tmp_path_factory) -> dict[str, dict]:
    from tests.support.site import built_site

    site = built_site(tmp_path_factory)
    return {p.stem: json.loads((site / "tutorials" / p.name).read_text(encoding="utf-8")) for p in NOTEBOOKS}


def test_the_three_notebooks_are_there_committed_without_outputs_and_each_is_a_page():
    assert {p.stem for p in NOTEBOOKS} >= {"quickstart", "depth_routing", "sinks_and_injection"}
    for path in NOTEBOOKS:
        nb = json.loads(path.read_text(encoding="utf-8"))
        assert all(not c.get("outputs") for c in nb["cells"] if c["cell_type"] == "code"), f"{path.name}: outputs"
    pages = "".join(p.read_text(encoding="utf-8") for p in (ROOT / "docs" / "tutorials").glob("*.md"))
    assert all(f'<!-- notebook "notebooks/{p.name}" -->' in pages for p in NOTEBOOKS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_quietly_and_its_figures_carry_images(path, executed):
    checks = _checks()
    nb = executed[path.stem]
    assert checks.problems(nb) == []
    outputs = checks.outputs(nb)
    figures = [o for o in outputs if checks.PLOTLY in o.get("data", {})]
    assert figures, "each notebook shows at least one plotly figure"
    if HAVE_BROWSER or os.environ.get("PROBE_REQUIRE_BROWSER") == "1":
        assert all(o["data"].get("image/png", "").startswith("iVBOR") for o in figures)  # base64 of a PNG header
    sources = [c["source"] for c in nb["cells"]]
    committed = [c["source"] for c in json.loads(path.read_text(encoding="utf-8"))["cells"]]
    assert ["".join(s) for s in sources] == ["".join(s) for s in committed]  # this notebook, as committed


def test_problems_are_found():
    checks = _checks()
    stream = {"output_type": "stream", "name": "stderr", "text": ["TqdmWarning: IProgress not found"]}
    bar = {"output_type": "display_data", "data": {checks.WIDGET: {}, "text/plain": ["Loading weights: 0%"]}}
    title = {"output_type": "display_data", "data": {checks.PLOTLY: {"layout": {"title": {"text": "— /tmp/tmpab12"}}}}}
    nb = {"cells": [{"cell_type": "code", "source": "", "outputs": [stream, bar, title]}]}
    assert [p.split(":")[0] for p in checks.problems(nb)] == [
        "stderr",
        "a widget (progress bar)",
        "a figure titled with a temporary folder",
    ]
