"""The glossary of printed terms (probe.present.glossary): every term points at a section docs/definitions.md has, a
verb's text lists the terms it shows (and only those) before its verdict, the words live in the glossary alone, and a
value outside a statistic's usual range gets its words in the sink verdict."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from probe.analyses.sinks import SINK_FACTOR, SINK_R0
from probe.present.glossary import DEFINITIONS, TERMS, glossed, glosses, remark
from probe.present.terminal import WIDTH, verdict, verdict_sentences
from tests.test_definitions import anchors

ROOT = Path(__file__).resolve().parents[2]


def test_every_term_points_at_a_section_of_the_definitions():
    known = anchors(ROOT / DEFINITIONS)
    missing = [f"{t.name} -> #{t.anchor}" for t in TERMS if t.anchor not in known]
    assert not missing, missing


def test_terms_are_named_once():
    names = [t.name for t in TERMS]
    assert len(names) == len(set(names))


def listed(lines: list[str]) -> list[str]:
    """The term names a ``terms:`` block lists, in its order."""
    return [m.group(1) for line in lines if (m := re.match(r"  (\S.*?): ", line))]


def test_a_block_lists_the_terms_shown_in_order_and_whole_words_only():
    shown = "layer  r0_later  dose\n 1  0.5  1.6\nthe q25 quiet reads"
    lines = glosses(shown)
    assert lines[:2] == ["", "terms:"]
    # r0 is not shown (only r0_later), nor delta (no such word); the cutoff's spelling q25 shows quiet reads
    assert listed(lines) == ["r0_later", "dose", "quiet reads"]
    assert all(len(line) <= WIDTH for line in lines) and f"{DEFINITIONS}#injection" in lines[-1]
    assert glosses("layer head\n 0 1") == []


def test_each_line_names_the_definition_of_its_term():
    for t in TERMS:
        text = " ".join(line.strip() for line in glosses(t.name)[2:])
        assert text.startswith(f"{t.name}: ") and text.endswith(f"({DEFINITIONS}#{t.anchor})"), text


def test_the_block_comes_before_the_verdict_and_covers_its_words():
    end = verdict("position 0 takes 7% of each row's real attention, 4.07x the causal-uniform share")
    text = glossed(["summary:", "  r0   0.39"], end)
    assert text.endswith(end) and verdict_sentences(text)
    body = text.split("\nverdict:\n")[0]
    assert listed(body.split("\n")) == ["r0", "pos0_over_uniform"]  # the verdict's "causal-uniform share" included


def test_the_glosses_live_in_the_glossary_alone():
    sources = [p for p in (ROOT / "probe").rglob("*.py") if p.name != "glossary.py"]
    for t in TERMS:
        for p in sources:
            assert t.gloss not in p.read_text(encoding="utf-8"), (t.name, p)


def test_values_outside_the_usual_range_get_words_and_usual_ones_none():
    # the ratio's thresholds mirrored about 1: as far from 1 as the sink rule's, on the other side
    assert remark("r0", 1.0) == "" and remark("r0", 0.3) == "" and remark("r0", 0.999 / SINK_R0) == ""
    assert "larger than the median read" in remark("r0", 1.001 / SINK_R0)
    assert remark("pos0_over_uniform", 1.0) == "" and remark("pos0_over_uniform", 5.0) == ""
    assert "less than a uniform row" in remark("pos0_over_uniform", 0.999 / SINK_FACTOR)
    assert remark("entropy", 99.0) == ""


@pytest.mark.parametrize(("ratio", "r0", "said"), [(1.24, 3.396, ["r0"]), (0.2, 1.0, ["ratio"]), (1.0, 1.0, [])])
def test_the_sink_verdict_says_what_an_unusual_r0_or_ratio_means(ratio, r0, said):
    from probe.present.sinks import sink_sentence

    row = pd.Series({"sink_formed": False, "pos0_over_uniform": ratio, "r0_later": r0, "pos0_share": 0.06,
                     "phantom_share": 0.0, "n_layers": 2})  # fmt: skip
    sentence = sink_sentence(row)
    assert ("larger than the median read" in sentence) == ("r0" in said)
    assert ("less than a uniform row" in sentence) == ("ratio" in said)
    assert sentence.startswith("no sink has formed")


def test_probe_sinks_glosses_its_columns():
    import torch

    from probe.analyses.sink_pass import sink_analyses
    from probe.models import create
    from probe.present import sinks

    torch.manual_seed(0)
    model = create("sink+proj", tier="tiny", seed=0)
    found = sink_analyses(model, torch.randint(0, 8192, (1, 2, 33)), massive=True, entropy=True, kurtosis=True)
    result = found["sinks"]  # as probe sinks puts the parts together
    for part in ("sink_eps", "massive", "entropy", "kurtosis"):
        result |= {f"{part}_{k}": v for k, v in found[part].items() if k in ("summary", "layers")}
    text = sinks.text(result)
    body = text.split("\nverdict:\n")[0].split("\n")
    terms = listed(body[body.index("terms:") :])
    want = ["pos0_share", "uniform_ref", "pos0_over_uniform", "r0", "r0_later", "phantom_share", "Sink^eps",
            "key0_mass", "massive activations", "entropy_norm", "kurtosis"]  # fmt: skip
    assert sorted(terms) == sorted(set(terms)) and not set(want) - set(terms), terms
