"""The definitions ship with the code: no citation of documents that do not ship, no issue numbers, no dead anchors.

Comments, docstrings, notebooks and the README point at ``docs/definitions.md#<anchor>`` and at the papers by name.
This test fails on a citation of the project's unshipped specification (its section sign or number), on an issue-number
reference (the word issue, issues or PR followed by a number, or a number after a hash sign in parentheses or in
prose), and on a ``docs/<page>.md#<anchor>`` whose page or anchor does not exist (anchors are GitHub's heading
slugs). One test per area (each package of ``probe/``, its top-level modules, tests, benchmarks, scripts, notebooks,
README), so an area can be checked alone while migrating:

    python -m pytest -p no:cacheprovider -n 0 -q tests/test_definitions.py -k "models or kernels"
    python tests/test_definitions.py probe/analyses tests/cli/test_cli.py      # the problems of some paths, one a line
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEXT_SUFFIXES = {".py", ".md", ".ipynb", ".sh", ".toml", ".cfg", ".yaml", ".yml", ".pyi"}
SKIP_DIRS = {"zoo", "corpora", "__pycache__", ".ipynb_checkpoints"}  # shipped weights and bundled text: not prose

# the unshipped specification cited by section sign or number, in any case, or by its file name
SPEC = re.compile(r"\bSPEC\s*(?:§|\d)|\bSPEC\.md\b", re.IGNORECASE)
# issue numbers: the word issue(s) (also hyphenated) or PR before a number, a hash-number in parentheses or in prose.
# Not: shebangs, "# comments", "#L12" line anchors, hex colours, markdown headings (see the cases below).
ISSUE = re.compile(
    r"\bissues?[\s-]+#?\d+\b|\(#\d+\)|\b(?:PR|pull request)\s*#?\d+\b"
    r"|(?<![\w&/#:\-])#\d+\b(?![\w-])",
    re.IGNORECASE,
)
HEX_COLOUR = re.compile(r"#(?:\d{3}|\d{6})\s*[;\"'}]")
# a link or reference to an anchor of a shipped page: docs/definitions.md#sink-rule
DOC_ANCHOR = re.compile(r"\bdocs/([\w.-]+\.md)#([^\s)\]<>'\"`,;:]+)")
SELF_ANCHOR = re.compile(r"\]\(#([^)\s]+)\)")  # [text](#anchor) inside a docs page


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: inline code and links reduced to their text, lower case, everything
    but letters, digits, '_', '-' and spaces dropped, spaces turned into '-'."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading anchor of a markdown page (outside fenced code), repeated slugs numbered as GitHub does."""
    seen: dict[str, int] = {}
    out, fenced = set(), False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        m = re.match(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if fenced or not m:
            continue
        s = slug(m.group(2))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def text_lines(path: Path):
    """(line label, text) of a file; a notebook's cell sources, labelled 'cell C line N'."""
    if path.suffix == ".ipynb":
        for c, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
            source = cell["source"]
            for n, line in enumerate(source.splitlines() if isinstance(source, str) else source, 1):
                yield f"cell {c} line {n}", line.rstrip("\n")
    else:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            yield str(n), line


def line_problems(line: str, page_anchors) -> list[str]:
    """What is wrong with one line of text: unshipped-spec citations, issue numbers, dead anchors."""
    found = [f"cites the unshipped spec: {m.group(0)!r}" for m in SPEC.finditer(line)]
    for m in ISSUE.finditer(line):
        if m.group(0).startswith("#") and HEX_COLOUR.match(line, m.start()):
            continue
        found.append(f"issue number: {m.group(0)!r}")
    for m in DOC_ANCHOR.finditer(line):
        page, anchor = m.group(1), m.group(2).rstrip(".")
        known = page_anchors(page)
        if known is None:
            found.append(f"link to a missing page: docs/{page}")
        elif anchor not in known:
            found.append(f"link to a missing anchor: docs/{page}#{anchor}")
    return found


def _page_anchors():
    cache: dict[str, set[str] | None] = {}

    def get(page: str):
        if page not in cache:
            path = ROOT / "docs" / page
            cache[page] = anchors(path) if path.is_file() else None
        return cache[page]

    return get


def files_under(path: Path):
    if path.is_file():
        yield path
        return
    for p in sorted(path.rglob("*")):
        if p.is_file() and p.suffix in TEXT_SUFFIXES and not SKIP_DIRS & set(p.relative_to(path).parts):
            yield p


def problems(paths) -> list[str]:
    """'file:line: what' for every problem in the given files or folders (relative to the repository root)."""
    page_anchors = _page_anchors()
    out = []
    for given in paths:
        for f in files_under(ROOT / given):
            rel = f.relative_to(ROOT).as_posix()
            for where, line in text_lines(f):
                out += [f"{rel}:{where}: {p}" for p in line_problems(line, page_anchors)]
    return out


def areas() -> list[str]:
    """The areas the rule covers: each package of probe/, probe's top-level modules, and the other roots."""
    probe = ROOT / "probe"
    packages = sorted(
        p.relative_to(ROOT).as_posix()
        for p in probe.iterdir()
        if p.is_dir() and p.name not in SKIP_DIRS and any(p.rglob("*.py"))
    )
    top = sorted(p.relative_to(ROOT).as_posix() for p in probe.glob("*.py"))
    roots = [
        r
        for r in ("tests", "benchmarks", "scripts", "notebooks", "README.md", "docs", "CHANGELOG.md", "mkdocs.yml")
        if (ROOT / r).exists()
    ]
    return packages + top + roots


@pytest.mark.parametrize("area", areas())
def test_no_unshipped_citations_or_dead_anchors(area):
    found = problems([area])
    assert not found, (
        f"{len(found)} citation problem(s) in {area} (cite docs/definitions.md#<anchor> or the paper "
        "by name; say what a thing is instead of its issue number):\n" + "\n".join(found)
    )


def test_definitions_page_links_resolve():
    """The page's own [text](#anchor) links point at its headings."""
    page = ROOT / "docs" / "definitions.md"
    known = anchors(page)
    dead = [f"{n}: #{a}" for n, line in text_lines(page) for a in SELF_ANCHOR.findall(line) if a not in known]
    assert not dead, "dead anchors in docs/definitions.md:\n" + "\n".join(dead)


def test_the_definitions_have_the_anchors_the_code_cites():
    known = anchors(ROOT / "docs" / "definitions.md")
    for a in (
        "rows-and-heads",
        "reads",
        "medians-and-quantiles",
        "sink-rule",
        "bos-rule",
        "evaluation-windows",
        "injection",
        "exposure",
        "sink-heads",
        "document-bootstrap",
        "cost-model",
        "hook-namespace",
    ):
        assert a in known


# ---- the detectors themselves, on known strings (the examples are split so this file passes its own check)
SPEC_WORD = "SP" + "EC"


@pytest.mark.parametrize(
    "text",
    [
        f"(see {SPEC_WORD} §5)",
        f"{SPEC_WORD} §8's rule",
        f"{SPEC_WORD} 5",
        f"{SPEC_WORD.lower()} §4",
        f"{SPEC_WORD}§3",
        f"{SPEC_WORD}.md",
    ],
)
def test_spec_citations_are_found(text):
    assert any("unshipped spec" in p for p in line_problems(text, lambda page: set()))


@pytest.mark.parametrize(
    "text",
    [
        "is" + "sue 18's check",
        "(is" + "sue #" + "7)",
        "pre-is" + "sue-17 keys",
        "I" + "ssues 3",
        "fixed in (#" + "15)",
        "as PR #" + "4 did",
        "see #" + "12 for more",
    ],
)
def test_issue_numbers_are_found(text):
    assert any("issue number" in p for p in line_problems(text, lambda page: set()))


@pytest.mark.parametrize(
    "text",
    [
        "#!/usr/bin/env bash",
        "# a comment",
        "## 5 Analyses",
        "code.py#L12",
        ".note{color:#555;font-style:italic}",
        "color: #555;",
        "line=dict(color='#1f77b4')",
        "the issue's setting",
        'metavar="' + SPEC_WORD + '"',
        "x = y  # 3 windows",
        "specs.py",
        "a spec 's field",
    ],
)
def test_ordinary_text_is_not_flagged(text):
    assert line_problems(text, lambda page: set()) == []


def test_anchor_links_are_checked(tmp_path):
    known = {"definitions.md": {"sink-rule"}}
    get = known.get
    assert line_problems("see docs/definitions.md#sink-rule.", get) == []
    assert line_problems("[rule](docs/definitions.md#sink-rule)", get) == []
    wrong = "docs/" + "definitions.md#sink-rules"  # split: this file passes its own check
    assert line_problems(wrong, get) == [f"link to a missing anchor: {wrong}"]
    assert line_problems("docs/" + "elsewhere.md#x", get) == ["link to a missing page: docs/elsewhere.md"]


def test_slugs_follow_github(tmp_path):
    page = tmp_path / "p.md"
    page.write_text(
        "# Title\n## Sink rule\n### Hook `names` (and shapes)\n## Sink rule\n```\n# not a heading\n```\n"
        "### Sink^ε, pooled\n",
        encoding="utf-8",
    )
    assert anchors(page) == {"title", "sink-rule", "hook-names-and-shapes", "sink-rule-1", "sinkε-pooled"}


if __name__ == "__main__":
    found = problems(sys.argv[1:] or areas())
    print("\n".join(found) or "no problems")
    sys.exit(1 if found else 0)
