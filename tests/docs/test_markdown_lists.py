"""Markdown lint for what renders wrong without an error: a list that starts right under a paragraph line (or a table
row or an HTML comment), with no blank line between, is not a list for Python-Markdown, the site's renderer; it
renders as one paragraph with the dashes in it (GitHub shows a list, so the page looks right there). Every page of the
site, the README and the changelog (which the site includes) are checked."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*.md")) + ["README.md", "CHANGELOG.md"]
ITEM = re.compile(r"^ {0,3}(?:[-*+]|\d+[.)]) +\S")
FENCE = re.compile(r"^ *(```|~~~)")


def lists_without_a_blank_line(markdown: str) -> list[int]:
    """Line numbers (1-based) of list items that open a list directly under a line of another block."""
    found, in_list, fence, previous = [], False, None, ""
    for n, line in enumerate(markdown.splitlines(), 1):
        if fence:
            fence = None if line.strip().startswith(fence) else fence
            previous = ""
            continue
        if m := FENCE.match(line):
            fence, in_list, previous = m.group(1), False, ""
            continue
        if not line.strip():
            previous = ""
            continue
        if ITEM.match(line):
            if previous and not in_list and not previous.lstrip().startswith("#"):
                found.append(n)
            in_list = True
        elif not previous and not line.startswith("  "):  # a new block after a blank line: the list has ended
            in_list = False
        previous = line
    return found


@pytest.mark.parametrize("page", PAGES)
def test_every_list_has_a_blank_line_above_it(page):
    text = (ROOT / page).read_text(encoding="utf-8")
    bad = [f"{page}:{n}: {text.splitlines()[n - 1][:70]!r}" for n in lists_without_a_blank_line(text)]
    assert not bad, "a list right under a paragraph renders as one paragraph on the site:\n" + "\n".join(bad)


def test_the_lint_catches_a_list_that_does_not_render_and_passes_those_that_do():
    import markdown

    broken = ["Where probe departs:\n- one\n- two\n", "| a |\n|---|\n| 1 |\n- one\n", "<!-- note -->\n- one\n"]
    fine = [
        "Where probe departs:\n\n- one\n  wrapped\n- two\n\nText after.\n",
        "# Heading\n- one\n",
        "- one\n\n  more of one\n- two\n",
        "```\ntext\n- not a list\n```\n",
    ]
    assert [lists_without_a_blank_line(t) for t in broken] == [[2], [4], [2]]
    assert [lists_without_a_blank_line(t) for t in fine] == [[], [], [], []]
    assert "<li>" not in markdown.markdown(broken[0]) and "<li>" in markdown.markdown(fine[0])  # what it guards
