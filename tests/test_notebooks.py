"""The notebooks in notebooks/ execute top to bottom through nbconvert (what `jupyter nbconvert --execute` runs) without
an error or a warning, and every plotly figure also carries a PNG (so it shows on GitHub) when a Chromium is there for
kaleido — always under CI (PROBE_REQUIRE_BROWSER=1). Tiny models; one torch thread."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
PLOTLY = "application/vnd.plotly.v1+json"
HAVE_BROWSER = any(shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome", "chrome"))


def test_the_three_notebooks_are_there():
    assert {p.stem for p in NOTEBOOKS} >= {"quickstart", "depth_routing", "sinks_and_injection"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_without_warnings_and_figures_carry_images(path, tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    preprocessors = pytest.importorskip("nbconvert.preprocessors")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the kernel inherits it: tiny tensors run fastest on one thread
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit notebooks without outputs"
    run = preprocessors.ExecutePreprocessor(timeout=600, kernel_name="python3")
    run.preprocess(nb, {"metadata": {"path": str(tmp_path)}})  # raises CellExecutionError on the first failing cell
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    warned = [o.text for o in outputs if o.output_type == "stream" and o.name == "stderr"]
    assert warned == [], warned  # warnings (and anything else on stderr) would show in the rendered notebook
    figures = [o for o in outputs if PLOTLY in o.get("data", {})]
    assert figures, "each notebook shows at least one plotly figure"
    if HAVE_BROWSER or os.environ.get("PROBE_REQUIRE_BROWSER") == "1":
        assert all(o["data"].get("image/png", "").startswith("iVBOR") for o in figures)  # base64 of a PNG header
