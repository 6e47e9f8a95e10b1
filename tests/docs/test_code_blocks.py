"""Every code block on the documentation site (docs/*.md, as scripts/docs/site.py expands them) and in the README is
marked on the line above its fence, and the mark is kept:

- ``<!-- executed -->``: this test runs it. A python block runs in a fresh namespace; an executed ``text`` block
  right after it is what it must print, line for line (so at the printed precision). A ``console`` block (or
  one without a language that starts with ``$ probe``) is a transcript: each ``$ probe ...`` line runs in-process
  from an empty directory and the lines shown under it must appear in its stdout, in order (``...`` skips lines).
- ``<!-- copied from a run; settings: ...; wall: ...; memory: ... -->``: shown on the site after the block, collapsed.
- ``<!-- not run here; why: ... -->``: a command this project cannot run (no cluster, no 20B weights offline); the
  reason is shown on the site.
- ``<!-- parsed -->``: a list of ``probe ...`` commands (comments after ``#``): each is parsed by the parser probe
  runs (its verb, recipe, flags and values exist and are valid), without running it.
- ``<!-- tested by tests/PATH.py -->``: a snippet that needs its context (a guide's step), written out and run by
  that test file: every class, function, decorator argument and string of the block must occur in it.

A block with no mark fails the first test."""

from __future__ import annotations

import contextlib
import io
import os
import shlex
from pathlib import Path

import pytest

from tests.support.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _site():
    return load_script("scripts/docs/site.py", "probe_docs_site")


site = _site()
PAGES = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")) + ["../README.md"]  # and the README


def blocks(page: str) -> list[dict]:
    return site.code_blocks(site.expand((DOCS / page).read_text(encoding="utf-8"), page))


@pytest.mark.parametrize("page", PAGES)
def test_every_code_block_is_executed_or_marked_as_copied(page):
    unmarked = [
        f"{page}: block at line {b['line']} ({b['info'] or 'no language'}): {b['text'][:80]!r}"
        for b in blocks(page)
        if b["mark"] is None
    ]
    assert not unmarked, (
        "mark each block <!-- executed --> (and make this test run it) or <!-- copied from a run; "
        "settings: ...; wall: ...; memory: ... -->:\n" + "\n".join(unmarked)
    )


def test_the_marks_are_recognised():
    page = (
        "<!-- executed -->\n```python\nprint(1)\n```\n\n<!-- copied from a run; settings: s; wall: 1 s; "
        "memory: 1 GB -->\n```\nout\n```\n\n<!-- copied from a run; wall: 1 s -->\n```\nx\n```\n"
        "<!-- not run here; why: no cluster -->\n```bash\nsbatch x\n```\n"
    )
    page += "<!-- tested by tests/x.py -->\n```python\nclass A: pass\n```\n<!-- parsed -->\n```\nprobe models\n```\n"
    assert [b["mark"] for b in site.code_blocks(page)] == ["executed", "copied", None, "not run", "tested by", "parsed"]
    assert _names_and_strings('@register_gate("g")\nclass G(B):\n    def f(self): return 1') == {"g", "G", "f"}
    shown = site.show_marks(page)
    copied = '??? note "Copied from a run"\n    settings: s; wall: 1 s; memory: 1 GB'
    not_run = '??? note "Not run here"\n    no cluster'
    assert shown.index("```\nout\n```") < shown.index(copied) < shown.index("```\nx\n```")  # after its block
    assert shown.index("sbatch x\n```") < shown.index(not_run) < shown.index("class A")
    assert '```\n\n??? note "Written out and run by a test"\n    `tests/x.py`' in shown
    assert "<!-- copied" not in shown.replace("<!-- copied from a run; wall", "")  # the mark without settings stays


def _names_and_strings(code: str) -> set[str]:
    """The identifiers a snippet defines and the strings it passes (what its test must define and pass too)."""
    import ast

    found = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            found.add(node.name)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.add(node.value)
    return found


@pytest.mark.parametrize("page", PAGES)
def test_snippets_occur_in_the_test_that_runs_them(page):
    for b in blocks(page):
        if b["mark"] == "tested by":
            test = (ROOT / b["detail"]).read_text(encoding="utf-8")
            missing = sorted(n for n in _names_and_strings(b["text"]) if n not in test)
            assert not missing, f"{page} line {b['line']}: {b['detail']} lacks {missing}"


def _parse_probe(command: str) -> None:
    """Parse one ``probe ...`` line as probe would (a recipe with its own parser), without running it."""
    from probe.cli.main import build_parser
    from probe.experiments import RECIPES
    from probe.experiments.command import build_parser as recipe_parser

    argv = shlex.split(command, comments=True)
    assert argv[0] == "probe", command
    if argv[1:3] == ["experiment", "--list"]:
        return
    if argv[1] == "experiment":
        assert argv[2] in RECIPES, f"{command}: no recipe {argv[2]!r}"
        recipe_parser(argv[2], "probe experiment").parse_args(argv[3:])
    else:
        build_parser().parse_args(argv[1:])


@pytest.mark.parametrize("page", PAGES)
def test_listed_commands_parse(page):
    for b in blocks(page):
        if b["mark"] == "parsed":
            lines = [ln for ln in b["text"].splitlines() if ln.strip()]
            assert lines, f"{page} line {b['line']}: an empty command list"
            for line in lines:
                try:
                    _parse_probe(line)
                except SystemExit as e:  # argparse's way out; probe's UsageParser raises UsageError instead
                    pytest.fail(f"{page} line {b['line']}: {line!r} does not parse ({e})")


def _run_python(code: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "<docs block>", "exec"), {"__name__": "__docs__"})
    return out.getvalue()


def _run_probe(command: str) -> str:
    from probe.cli.main import main

    argv = shlex.split(command)
    assert argv[0] == "probe", f"a transcript runs probe commands only: {command!r}"
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(argv[1:]) == 0, command
    return out.getvalue()


def _shown_in_order(shown: list[str], got: list[str]) -> str | None:
    """None when the shown lines (chunks between '...' lines) appear in ``got`` in order, each chunk contiguous."""
    chunks, chunk = [], []
    for line in shown:
        if line.strip() == "...":
            chunks.append(chunk)
            chunk = []
        else:
            chunk.append(line.rstrip())
    chunks.append(chunk)
    at = 0
    for chunk in filter(None, chunks):
        found = next((i for i in range(at, len(got) - len(chunk) + 1) if got[i : i + len(chunk)] == chunk), None)
        if found is None:
            return "\n".join(chunk)
        at = found + len(chunk)
    return None


def executed_pages() -> list[str]:
    return [p for p in PAGES if any(b["mark"] == "executed" for b in blocks(p))]


@pytest.mark.parametrize("page", executed_pages())
def test_executed_blocks_print_what_the_page_shows(page, tmp_path, one_thread):
    page_blocks = blocks(page)
    cwd = os.getcwd()
    os.chdir(tmp_path)  # a transcript's --out lands in a fresh folder
    try:
        for i, b in enumerate(page_blocks):
            if b["mark"] != "executed":
                continue
            if b["info"] == "python":
                printed = _run_python(b["text"])
                after = page_blocks[i + 1] if i + 1 < len(page_blocks) else None
                if after is not None and after["mark"] == "executed" and after["info"] == "text":
                    assert printed.rstrip().splitlines() == after["text"].rstrip().splitlines(), (
                        f"{page} line {b['line']}: printed\n{printed}"
                    )
            elif b["info"] in ("console", "") and b["text"].startswith("$ probe "):
                lines = b["text"].splitlines()
                starts = [k for k, ln in enumerate(lines) if ln.startswith("$ ")] + [len(lines)]
                assert starts[0] == 0, f"{page} line {b['line']}: a transcript starts with a '$ ' command"
                for k, end in zip(starts, starts[1:], strict=False):
                    got = [ln.rstrip() for ln in _run_probe(lines[k][2:]).splitlines()]
                    missing = _shown_in_order(lines[k + 1 : end], got)
                    assert missing is None, (
                        f"{page} line {b['line']}: {lines[k]} did not print\n{missing}\nit printed:\n" + "\n".join(got)
                    )
            elif b["info"] == "text":
                before = page_blocks[i - 1] if i else None
                assert before is not None and before["mark"] == "executed" and before["info"] == "python", (
                    f"{page} line {b['line']}: an executed text block is the output of the python block above it"
                )
            else:
                pytest.fail(f"{page} line {b['line']}: an executed block is python, console or text, not {b['info']!r}")
    finally:
        os.chdir(cwd)
