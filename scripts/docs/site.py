"""The documentation site's one piece of machinery (an MkDocs hook, named in mkdocs.yml): it fills the pages' directives
from the sources they document, so nothing on the site is a hand-made copy.

Directives (HTML comments, so a page read on GitHub shows nothing where they stand):

    <!-- cli-reference -->                                 every verb's and recipe's flags, from the live parser
    <!-- include "CHANGELOG.md" -->                         a repository file, its title left out

Code-block marks (on the line just above a fence; tests/docs/test_code_blocks.py fails on a block with neither):

    <!-- executed -->                                      tests/docs/test_code_blocks.py runs it and compares
    <!-- copied from a run; settings: ...; wall: ...; memory: ... -->   shown on the site above the block
    <!-- not run here; why: ... -->                        a command this project cannot run; the reason is shown
    <!-- tested by tests/x.py -->                           a snippet a test file writes out and runs (its names and
                                                           strings must occur there)
    <!-- parsed -->                                        a list of probe commands, each parsed by probe's parser

The pages hold their own text (the README's reference sections moved here; the README keeps what a newcomer needs
first and links to these pages). Run as a script it prints one page's expanded markdown:
``python scripts/docs/site.py docs/reference/cli.md``.
"""

from __future__ import annotations

import argparse
import posixpath
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLI = "<!-- cli-reference -->"
INCLUDE = re.compile(r"^<!-- include \"(?P<path>[\w./-]+)\" -->$", re.M)
EXECUTED = re.compile(r"^<!-- executed -->$")
PARSED = re.compile(r"^<!-- parsed -->$")
COPIED = re.compile(r"^<!-- copied from a run; (?P<what>settings: [^>]+; wall: [^>]+; memory: [^>]+) -->$")
TESTED_BY = re.compile(r"^<!-- tested by (?P<path>tests/[\w/]+\.py) -->$")
NOT_RUN = re.compile(r"^<!-- not run here; why: (?P<why>[^>]+) -->$")
FENCE = re.compile(r"^(```|~~~)")
LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")


# ---- included files


def relink(text: str, page: str) -> str:
    """An included repository file's links made right for a site page: links into docs/ (pages, anchors, images)
    relative to ``page`` (a path in docs/), other repository paths shown as code (the site holds only docs/), web
    links kept."""

    def one(m):
        bang, label, target = m.groups()
        if re.match(r"[a-z]+:", target):
            return m.group(0)
        if target.startswith("#"):  # a heading of the included file, not on this page: the text alone
            return label
        if target.startswith("docs/"):
            rel = posixpath.relpath(target[len("docs/") :], posixpath.dirname(page) or ".")
            return f"{bang}[{label}]({rel})"
        return f"{label} (`{target}`)" if label.strip("`") != target else f"`{target}`"

    return LINK.sub(one, text)


# ---- the CLI reference


def cli_reference() -> str:
    """Every verb and `probe experiment` recipe: its description, usage, and a table of its flags with their
    defaults and choices, straight from the parser `probe` runs."""
    from probe.cli.main import build_parser
    from probe.experiments import RECIPES
    from probe.experiments.command import build_parser as recipe_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {a.dest: a.help for a in sub._choices_actions}
    parts = [_parser_section("probe", parser, parser.description)]
    for name, p in sub.choices.items():
        parts.append(_parser_section(f"probe {name}", p, helps.get(name) or p.description))
    for name in RECIPES:
        p = recipe_parser(name, "probe experiment")
        parts.append(_parser_section(f"probe experiment {name}", p, p.description, level=3))
    return "\n".join(parts)


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _parser_section(title: str, p: argparse.ArgumentParser, description: str | None, level: int = 2) -> str:
    usage = p.format_usage().strip().removeprefix("usage: ")
    rows = []
    for a in p._actions:
        if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        flag = ", ".join(f"`{o}`" for o in a.option_strings) or f"`{a.metavar or a.dest}` (positional)"
        default = (
            ""
            if a.default in (None, argparse.SUPPRESS) or isinstance(a, argparse._VersionAction)
            else f"`{a.default!r}`"
        )
        choices = "" if a.choices is None else ", ".join(f"`{c}`" for c in a.choices)
        help_text = (a.help or "").replace("%(default)s", str(a.default)).replace("%%", "%")
        rows.append(f"| {flag} | {_cell(default)} | {_cell(choices)} | {_cell(help_text)} |")
    table = "| flag | default | choices | what it does |\n|---|---|---|---|\n" + "\n".join(rows) if rows else ""
    return (
        f"{'#' * level} `{title}`\n\n{_cell(description or '')}\n\n<pre><code>{_escape(usage)}</code></pre>\n\n"
        f"{table}\n"
    )


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


# ---- pages


def expand(markdown: str, page: str) -> str:
    """A page's markdown with its directives filled (``page``: its path under docs/, for links)."""
    markdown = INCLUDE.sub(
        lambda m: relink(re.sub(r"\A# .*\n", "", (ROOT / m["path"]).read_text(encoding="utf-8")), page), markdown
    )
    if CLI in markdown:
        markdown = markdown.replace(CLI, cli_reference())
    return markdown


def code_blocks(markdown: str) -> list[dict]:
    """Every fenced block of a page: its info string, its text, the line its fence opens on, and its mark
    ('executed', 'copied' with what it was copied from, 'not run' with why, 'tested by' with the test file, or
    None)."""
    lines, blocks, i = markdown.splitlines(), [], 0
    while i < len(lines):
        m = FENCE.match(lines[i].lstrip())
        if not m:
            i += 1
            continue
        fence, info, start = m.group(1), lines[i].lstrip()[3:].strip(), i
        j = next((k for k in range(i + 1, len(lines)) if lines[k].lstrip().startswith(fence)), len(lines))
        above = next((lines[k].strip() for k in range(start - 1, -1, -1) if lines[k].strip()), "")
        mark, what = (
            ("executed", None)
            if EXECUTED.match(above)
            else ("parsed", None)
            if PARSED.match(above)
            else ("copied", COPIED.match(above)["what"])
            if COPIED.match(above)
            else ("not run", NOT_RUN.match(above)["why"])
            if NOT_RUN.match(above)
            else ("tested by", TESTED_BY.match(above)["path"])
            if TESTED_BY.match(above)
            else (None, None)
        )
        blocks.append(
            {"info": info, "text": "\n".join(lines[i + 1 : j]), "line": start + 1, "mark": mark, "detail": what}
        )
        i = j + 1
    return blocks


def show_marks(markdown: str) -> str:
    """The site shows a copied block's settings, wall time and memory above it, and why a block was not run."""
    markdown = re.sub(
        r"^<!-- copied from a run; (settings: [^>]+) -->$", r"*Copied from a run* — \1", markdown, flags=re.M
    )
    markdown = re.sub(
        r"^<!-- tested by (tests/[\w/]+\.py) -->$", r"*Written out and run by* `\1`", markdown, flags=re.M
    )
    return re.sub(r"^<!-- not run here; why: ([^>]+) -->$", r"*Not run here* — \1", markdown, flags=re.M)


def on_page_markdown(markdown: str, page, config, files) -> str:  # the MkDocs hook
    return show_marks(expand(markdown, page.file.src_uri))


if __name__ == "__main__":
    for name in sys.argv[1:]:
        path = Path(name).resolve()
        print(expand(path.read_text(encoding="utf-8"), path.relative_to(ROOT / "docs").as_posix()))
