"""Every analysis verb's terminal text ends in its verdict (probe.present.terminal.verdict): one ``verdict:`` block of
``- `` items at most 120 columns wide; for gates, sources, eval and ablate the sentences its page leads with, for
sinks the sink rule's."""

from __future__ import annotations

import html
import re

import pytest

from probe.present.terminal import WIDTH, verdict_sentences
from tests.support.cli import WINDOWS, probe

VERBS = {
    "sinks": ["--model", "probe/tiny-sink+proj"],
    "gates": ["--model", "probe/tiny-sink+proj", "--min-count", "2"],
    "sources": ["--model", "probe/tiny-attnres-block4"],
    "eval": ["--model", "probe/tiny-baseline"],
    "ablate": ["--model", "probe/tiny-sink+proj", "--ablate", "knockout"],
}


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_the_text_ends_in_a_verdict(verb, tmp_path):
    r = probe(verb, *VERBS[verb], *WINDOWS, "--quiet", "--out", tmp_path / verb)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("\nverdict:\n") == 1
    block = r.stdout.rstrip().split("\nverdict:\n")[1].splitlines()
    assert block[0].startswith("- ") and all(len(line) <= WIDTH for line in block)
    said = verdict_sentences(r.stdout)
    assert said
    if verb == "sinks":
        (sentence,) = said
        assert re.match(r"(a|no) sink has formed: position 0 takes \d", sentence)
        return
    page = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", (tmp_path / verb / f"{verb}.html").read_text())).split())
    for sentence in said:
        assert sentence in page, sentence
