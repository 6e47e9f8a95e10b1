"""The notebooks in notebooks/ as documentation pages: each executed top to bottom in a fresh kernel (nbclient, what
`jupyter nbconvert --execute` runs), checked, and written as the Markdown of a site page with its outputs.

    python scripts/docs/notebooks.py notebooks/quickstart.ipynb OUT.ipynb     # execute one, write it executed

The site's hook (scripts/docs/site.py) runs that for each ``<!-- notebook "notebooks/NAME.ipynb" -->`` of a page, in a
fresh process from an empty temporary folder with one torch thread and the hub offline, then turns the executed
notebook into the page (``page_markdown``); ``problems`` lists what must not be in an executed notebook (an error,
anything on stderr, a progress-bar widget, a figure titled with a temporary folder), and the build fails on any.
tests/test_notebooks.py checks the same on the notebooks the site build executed.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from pathlib import Path

PLOTLY = "application/vnd.plotly.v1+json"
WIDGET = "application/vnd.jupyter.widget-view+json"  # a tqdm bar in a notebook with ipywidgets: a loading bar
TIMEOUT = 900  # seconds per cell


def environment() -> dict:
    """The kernel's environment: one torch thread (tiny tensors run fastest on one), the hub offline."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def execute(path: Path, out: Path) -> None:
    """Run notebook ``path`` from an empty temporary folder and write it, with its outputs, to ``out``."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory(prefix="probe-notebook-") as tmp:
        NotebookClient(nb, timeout=TIMEOUT, kernel_name="python3", resources={"metadata": {"path": tmp}}).execute()
    nbformat.write(nb, out)


def outputs(nb: dict) -> list[dict]:
    return [o for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])]


def problems(nb: dict) -> list[str]:
    """What a rendered notebook must not show: an error, a stream on stderr (a warning, a progress line), a widget
    (a loading bar), a figure titled with a temporary folder's path instead of the model's name."""
    found = []
    tmp = re.compile(re.escape(tempfile.gettempdir()) + r"/|/tmp/")
    for o in outputs(nb):
        if o["output_type"] == "error":
            found.append(f"error: {o.get('ename')}: {o.get('evalue')}")
        elif o["output_type"] == "stream" and o.get("name") == "stderr":
            found.append(f"stderr: {''.join(o['text'])[:300]!r}")
        data = o.get("data", {})
        if WIDGET in data:
            found.append(f"a widget (progress bar): {''.join(data.get('text/plain', ''))[:120]!r}")
        if PLOTLY in data:
            title = json.dumps(data[PLOTLY].get("layout", {}).get("title", ""))
            if tmp.search(title):
                found.append(f"a figure titled with a temporary folder: {title[:200]}")
    return found


def page_markdown(nb: dict, relink, raw) -> str:
    """The notebook as a page: its Markdown cells (the first heading dropped: the page has its own title; links
    made right by ``relink``), each code cell as a Python block followed by its outputs: text as a text block,
    tables (HTML), images and plotly figures through ``raw``, which stores an HTML fragment and returns the
    placeholder the page carries in its stead."""
    parts = []
    for i, cell in enumerate(nb["cells"]):
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            if i == 0:
                source = re.sub(r"\A# .*\n?", "", source)
            parts.append(relink(source))
        elif cell["cell_type"] == "code" and source.strip():
            parts.append(f"```python\n{source}\n```")
            parts += [shown for o in cell.get("outputs", []) if (shown := _output(o, raw))]
    return "\n\n".join(parts) + "\n"


def _output(o: dict, raw) -> str | None:
    if o["output_type"] == "stream":
        return f"```text\n{''.join(o['text']).rstrip()}\n```"
    data = o.get("data", {})
    if PLOTLY in data:
        return raw(("plotly", data[PLOTLY]))
    if "text/html" in data:
        return raw(("html", f"<div class='probe-output'>{''.join(data['text/html'])}</div>"))
    if "image/png" in data:
        return raw(("html", f"<img class='probe-output' alt='figure' src='data:image/png;base64,{data['image/png']}'>"))
    if "text/plain" in data:
        return f"```text\n{''.join(data['text/plain']).rstrip()}\n```"
    return None


if __name__ == "__main__":
    execute(Path(sys.argv[1]), Path(sys.argv[2]))
