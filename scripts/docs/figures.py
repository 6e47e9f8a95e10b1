"""The figures a command draws, for the documentation site: runs one ``probe`` command line, exactly as a page shows
it (its ``--out`` replaced by a temporary folder, ``--quiet`` added), and writes every plotly figure it put on its
pages as a JSON list. The figures are caught where every page probe writes is assembled
(``probe.present.page.page``), so they are the command's own, not redrawn.

    python scripts/docs/figures.py OUT.json probe sinks --model probe/bb-baseline --batches 2
    python scripts/docs/figures.py --batch REQUESTS.json      # [[OUT.json, "probe ..."], ...], one after another

The site's hook (scripts/docs/site.py) runs every ``<!-- figure: probe ... -->`` of the site in one such batch, a
process of its own with one torch thread, beside the notebooks (a process per figure spent ~6 s of each figure's
~10 importing torch, transformers and plotly).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path


def command_argv(command: str, out: str) -> list[str]:
    """``probe ...`` → the argument list probe's main takes, writing into ``out`` and quiet."""
    argv = shlex.split(command)
    if argv[:1] != ["probe"]:
        raise ValueError(f"a figure's command starts with probe: {command!r}")
    argv = argv[1:]
    if "--out" in argv:
        argv[argv.index("--out") + 1] = out
    else:
        argv += ["--out", out]
    return argv if "--quiet" in argv else [*argv, "--quiet"]


_drawn: list[str] = []  # the figures of the command running now, each once, as plotly JSON


def _catch_pages() -> None:
    """Route every page probe writes through a catcher of its figures, once per process, before any verb imports
    ``page`` by name (a verb module binds the catcher at its import: a later patch would not reach it)."""
    import probe.present.page as page_module

    if getattr(page_module.page, "catches_figures", False):
        return
    original = page_module.page

    def page(title, figures=(), **kwargs):
        for fig in figures:
            spec = fig.to_json()
            if spec not in _drawn:
                _drawn.append(spec)
        return original(title, figures, **kwargs)

    page.catches_figures = True
    page_module.page = page


def capture(command: str) -> list[dict]:
    """Run ``command`` in this process (from a temporary folder) and return the figures its pages hold, in order,
    each once (a recipe's report page repeats its figures' own pages)."""
    _catch_pages()
    from probe.cli.main import main

    _drawn.clear()
    printed = io.StringIO()
    with tempfile.TemporaryDirectory(prefix="probe-docs-figure-") as tmp:
        cwd = os.getcwd()
        os.chdir(tmp)
        try:
            with contextlib.redirect_stdout(printed):  # the tables: the page shows what it copied of them
                code = main(command_argv(command, str(Path(tmp) / "out")))
        finally:
            os.chdir(cwd)
    if code:
        raise SystemExit(f"{command!r} exited with {code}:\n{printed.getvalue()[-2000:]}")
    if not _drawn:
        raise SystemExit(f"{command!r} drew no figure")
    return [json.loads(spec) for spec in _drawn]


def write_figures(out: str, command: str) -> None:
    Path(out).write_text(json.dumps(capture(command)), encoding="utf-8")


if __name__ == "__main__":
    if sys.argv[1] == "--batch":
        for out, command in json.loads(Path(sys.argv[2]).read_text(encoding="utf-8")):
            write_figures(out, command)
    else:
        write_figures(sys.argv[1], shlex.join(sys.argv[2:]))
