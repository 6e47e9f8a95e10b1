"""The figures a command draws, for the documentation site: runs one ``probe`` command line, exactly as a page shows
it (its ``--out`` replaced by a temporary folder, ``--quiet`` added), and writes every plotly figure it put on its
pages as a JSON list. The figures are caught where every page probe writes is assembled
(``probe.present.page.page``), so they are the command's own, not redrawn.

    python scripts/docs/figures.py OUT.json probe sinks --model probe/bb-baseline --batches 2

The site's hook (scripts/docs/site.py) runs it for each ``<!-- figure: probe ... -->`` of a page, in a fresh process
with one torch thread, in parallel with the other figures and the notebooks.
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


def capture(command: str) -> list[dict]:
    """Run ``command`` in this process (from a temporary folder) and return the figures its pages hold, in order,
    each once (a recipe's report page repeats its figures' own pages)."""
    import probe.present.page as page_module

    drawn: list[str] = []
    original = page_module.page

    def page(title, figures=(), **kwargs):
        for fig in figures:
            spec = fig.to_json()
            if spec not in drawn:
                drawn.append(spec)
        return original(title, figures, **kwargs)

    page_module.page = page  # before the verbs import it
    from probe.cli.main import main

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
    if not drawn:
        raise SystemExit(f"{command!r} drew no figure")
    return [json.loads(spec) for spec in drawn]


if __name__ == "__main__":
    out, command = sys.argv[1], shlex.join(sys.argv[2:])
    figures = capture(command)
    Path(out).write_text(json.dumps(figures), encoding="utf-8")
