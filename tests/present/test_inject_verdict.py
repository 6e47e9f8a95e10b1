"""`probe inject`'s verdict (docs/definitions.md#injection): an effect when |delta| > 2 standard errors over batches
and >= 1% of the clean loss (tests/present/test_verdicts.py: "detectable but negligible" below it), the clean pass's
sink statistics equal `probe sinks`'s on the same windows, the pointer to a model where injection moves the loss is
shown when the loss did not move or no sink formed (and that model does show it), and a dose outside the definition's
range is a one-line warning."""

from __future__ import annotations

import pandas as pd
import pytest

from probe.analyses.inject import dose_warning, inject
from probe.analyses.sinks import sink_stats
from probe.present import inject as presentation
from probe.present.terminal import WIDTH, verdict_sentences
from tests.support.analyses import tiny, windows
from tests.support.cli import WINDOWS, probe


def fake(deltas, ses, loss_clean=5.0):
    """An inject result whose per-batch rows (two batches) have these means and standard errors over batches: the
    per-batch deltas are mean ± se (ddof 1 over two batches gives s.e. = |b1 - b2| / 2)."""
    rows, per_batch = [], []
    for dose, (d, se) in enumerate(zip(deltas, ses), start=1):
        rows.append({"junk": "structured", "cutoff": "q25", "dose": 0.2 * dose, "loss_clean": loss_clean,
                     "loss_corrupted": loss_clean + d, "delta": d})  # fmt: skip
        per_batch += [{"junk": "structured", "cutoff": "q25", "dose": 0.2 * dose, "batch": b, "delta": d + s}
                      for b, s in enumerate((-se, se))]  # fmt: skip
    return {"results": pd.DataFrame(rows), "per_batch": pd.DataFrame(per_batch)}


def test_the_loss_moved_past_two_standard_errors_and_says_which_way():
    moved, line = presentation.effect_sentence(presentation.results_with_se(fake([0.001, 0.3], [0.001, 0.1])))
    assert moved is True and line.startswith("the loss rose (in 1 of 2 conditions; the largest shown)")
    assert "+0.3 ± 0.1 nats per token (3 standard errors; 6% of the clean loss 5)" in line
    assert "|delta| > 2 standard errors over batches" in line
    moved, line = presentation.effect_sentence(presentation.results_with_se(fake([-0.05], [0.01])))
    assert moved is True and line.startswith("the loss fell: ") and "-0.05 ± 0.01" in line


def test_no_effect_within_two_standard_errors_points_where_it_shows():
    result = fake([0.0017, -0.001], [0.0009, 0.002])  # 1.9 and 0.5 standard errors
    moved, line = presentation.effect_sentence(presentation.results_with_se(result))
    assert moved is False
    assert line.startswith("no effect: the loss did not move; the largest of 2 conditions, structured junk")
    assert "+0.0017 ± 0.0009" in line
    lines = presentation.injection_verdicts(result)
    assert lines[-1] == f"where injection moves the loss: {presentation.SHOWS_AN_EFFECT}"


def test_one_batch_cannot_tell():
    result = fake([0.3], [0.1])
    result["per_batch"] = result["per_batch"].iloc[:1]
    moved, line = presentation.effect_sentence(presentation.results_with_se(result))
    assert moved is None and line.startswith("cannot tell whether the loss moved")


def test_the_clean_pass_has_the_sink_statistics_of_probe_sinks():
    model, toks = tiny("sinklogit"), windows(2, 3, 16)
    got = inject(model, toks, junk=["gaussian"], doses=[0.4])["sinks"].iloc[0]
    want = sink_stats(model, toks)["summary"].iloc[0]
    for col in ("pos0_share", "phantom_share", "r0", "uniform_ref", "pos0_over_uniform", "r0_later"):
        assert float(got[col]) == pytest.approx(float(want[col]), rel=1e-5, abs=1e-7), col
    assert bool(got["sink_formed"]) == bool(want["sink_formed"])


def test_the_terminal_text_ends_in_the_verdict_with_the_sink_and_the_pointer(tmp_path):
    r = probe("inject", "--model", "probe/tiny-sink+proj", "--junk", "gaussian", "--dose", "0.4", "--batches", "2",
              "--batch-size", "2", "--ctx", "32")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "delta_se" in r.stdout and r.stdout.count("\nverdict:\n") == 1
    assert all(len(line) <= WIDTH for line in r.stdout.split("\nverdict:\n")[1].splitlines())
    effect, sink, pointer = verdict_sentences(r.stdout)
    assert effect.startswith(("the loss rose", "the loss fell", "no effect"))
    assert sink.startswith("the clean pass: no sink has formed: position 0 takes")  # the shipped tiny models have none
    assert pointer == f"where injection moves the loss: {presentation.SHOWS_AN_EFFECT}"


def test_the_model_the_pointer_names_moves_its_loss_and_has_a_sink():
    r = probe("inject", "--model", "probe/bb-baseline", "--data", "synthetic:bb", "--dose", "1.6", "--batches", "4",
              "--batch-size", "4", "--ctx", "128", "--quiet")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "--model probe/bb-baseline --data synthetic:bb --dose 1.6" in presentation.SHOWS_AN_EFFECT
    effect, sink = verdict_sentences(r.stdout)  # no pointer: the loss moved and a sink has formed
    assert effect.startswith("the loss rose: structured junk on the q25 quiet reads at dose 1.6")
    assert sink.startswith("the clean pass: a sink has formed")


def test_a_dose_outside_the_range_is_a_one_line_warning():
    assert dose_warning([0.2, 1.6]) is None
    assert dose_warning([0.4, 4]).startswith("dose 4 is outside the range the injection definition covers, 0 to 1.6")
    r = probe("inject", "--model", "probe/tiny-baseline", "--junk", "gaussian", "--dose", "4", *WINDOWS)
    assert r.returncode == 0, r.stderr
    (line,) = [ln for ln in r.stderr.splitlines() if "warning" in ln]
    assert line.startswith("probe inject: warning: --dose 4 is outside the range") and "0 to 1.6" in line
    r = probe("inject", "--model", "probe/tiny-baseline", "--dose", "-1", *WINDOWS)
    assert r.returncode == 2 and "--dose" in r.stderr


def test_report_warns_of_a_dose_past_the_definition(tmp_path):
    out = tmp_path / "r"
    r = probe("report", "--models", "probe/tiny-baseline", "--inject-doses", "0.4", "4", *WINDOWS, "--out", out)
    assert r.returncode == 0, r.stderr
    (line,) = [ln for ln in r.stderr.splitlines() if "warning" in ln]
    assert line.startswith("probe report: warning: --inject-doses 4 is outside the range") and "0 to 1.6" in line
