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


# the injection verdict states practical size as well as noise (docs/definitions.md#injection)


def injection_result(deltas, ses, loss_clean=5.272):
    """An inject result of two batches per condition whose deltas have these means and standard errors over batches."""
    import pandas as pd

    rows, per_batch = [], []
    for i, (d, se) in enumerate(zip(deltas, ses), start=1):
        rows.append({"junk": "structured", "cutoff": "q25", "dose": 0.4 * i, "loss_clean": loss_clean,
                     "loss_corrupted": loss_clean + d, "delta": d})  # fmt: skip
        per_batch += [{"junk": "structured", "cutoff": "q25", "dose": 0.4 * i, "batch": b, "delta": d + s}
                      for b, s in enumerate((-se, se))]  # fmt: skip
    return {"results": pd.DataFrame(rows), "per_batch": pd.DataFrame(per_batch)}


def test_a_detectable_change_below_one_percent_of_the_clean_loss_is_negligible_not_an_effect():
    from probe.present import inject

    # the getting-started run: +0.00166 ± 0.00071 nats (2.4 standard errors), 0.03% of the clean loss 5.272
    result = injection_result([0.001664], [0.000707])
    effect, line = inject.effect_sentence(inject.results_with_se(result))
    assert effect is False
    assert line.startswith("the loss rose, detectable but negligible: structured junk on the q25 quiet reads")
    assert "(2.4 standard errors; 0.0316% of the clean loss 5.272)" in line
    assert line.endswith(
        "not an effect, which needs |delta| > 2 standard errors over batches and >= 1% of the clean loss"
    )
    assert "an effect:" not in line
    lines = inject.injection_verdicts(result)
    assert lines[-1] == f"where injection moves the loss: {inject.SHOWS_AN_EFFECT}"  # negligible: where it is not


def test_an_effect_is_detectable_and_not_negligible_and_says_both_rules():
    from probe.present import inject

    effect, line = inject.effect_sentence(inject.results_with_se(injection_result([0.0017, 0.456], [0.0007, 0.057])))
    assert effect is True and line.startswith("the loss rose (in 1 of 2 conditions; the largest shown): ")
    assert "(8 standard errors; 8.65% of the clean loss 5.272)" in line
    assert line.endswith("; an effect: |delta| > 2 standard errors over batches and >= 1% of the clean loss")
    # large but noisy: not detectable, however large
    effect, line = inject.effect_sentence(inject.results_with_se(injection_result([0.2], [0.15])))
    assert effect is False and line.startswith("no effect: the loss did not move; ")
    assert line.endswith("an effect needs |delta| > 2 standard errors over batches and >= 1% of the clean loss")


def test_the_injection_rule_is_the_one_the_definitions_state():
    from pathlib import Path

    from probe.present import inject

    text = (Path(__file__).resolve().parents[2] / "docs" / "definitions.md").read_text()
    section = " ".join(text.split("### Injection", 1)[1].split("\n### ", 1)[0].split())
    assert inject.EFFECT_SE == 2 and inject.EFFECT_SHARE == 0.01
    assert "**2** of its [standard errors over batches]" in section and "**1 %** of the clean loss" in section
    assert "detectable but negligible" in section


def test_a_sink_verdict_is_never_drawn_from_nan():
    import pandas as pd

    from probe.present.sinks import sink_sentence

    row = pd.Series({"pos0_share": float("nan"), "pos0_over_uniform": float("nan"), "r0_later": 1.0,
                     "sink_formed": None, "n_layers": 2})  # fmt: skip
    line = sink_sentence(row)
    assert line.startswith("no sink verdict: ") and "nan%" not in line and "no sink has formed" not in line
