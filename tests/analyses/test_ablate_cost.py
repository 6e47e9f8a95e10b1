"""The cost line of `probe ablate` (docs/definitions.md#ablations): a warmed-up, repeated measurement, clean and
ablated forwards interleaved, stated with its spread or not at all. Tested with a scripted clock, never real
timings."""

import math

import pytest

from probe.analyses import ablate as A
from probe.present.ablate import cost_line, text
from tests.support.analyses import tiny, windows

W = windows(n_batches=2, batch=2, ctx=16)


class ScriptedClock:
    """A clock whose successive forwards last the given durations (each forward reads the clock twice)."""

    def __init__(self, durations):
        self.durations, self.now, self.started = list(durations), 0.0, False

    def __call__(self) -> float:
        if self.started:
            self.now += self.durations.pop(0)
        self.started = not self.started
        return self.now


def test_a_warm_repeated_measure_is_the_median_ratio_with_its_quartiles(monkeypatch):
    """5 pairs in ABBA order after an untimed warm-up: the clean and ablated times are told apart by the order."""
    # repeat r: (clean, ablated) when r is even, (ablated, clean) when odd
    clean = [1.0, 1.1, 0.9, 1.0, 1.0]
    ablated = [2.0, 2.3, 1.8, 2.1, 1.9]  # ratios 2, 2.09, 2, 2.1, 1.9
    script = []
    for r in range(5):
        script += [clean[r], ablated[r]] if r % 2 == 0 else [ablated[r], clean[r]]
    calls = []
    real_pairs = A._timed_pairs

    def spy(*args, **kw):
        out = real_pairs(*args, **kw)
        calls.append(out)
        return out

    monkeypatch.setattr(A, "_clock", ScriptedClock(script))
    monkeypatch.setattr(A, "_timed_pairs", spy)
    res = A.ablate(tiny("sink+proj"), W, ["knockout"], per_layer=False, progress=False)
    assert len(calls) == 1  # the warm-up pair is not timed; ablated forwards land on the ablated side
    assert calls[0][0] == pytest.approx(clean) and calls[0][1] == pytest.approx(ablated)
    meta = res["meta"].attrs["meta"]
    assert meta["cost_repeats"] == 5 and meta["cost_stated"]
    assert meta["clean_forward_s"] == pytest.approx(1.0) and meta["ablated_forward_s"] == pytest.approx(2.0)
    assert meta["cost_ratio"] == pytest.approx(2.0)
    assert meta["cost_ratio_q1"] == pytest.approx(2.0) and meta["cost_ratio_q3"] == pytest.approx(2.3 / 1.1)
    # each row: the median of its one timing per batch over the measured clean forward (real clock: only finite)
    assert res["results"]["cost_ratio"].map(math.isfinite).all()
    assert "ablated forward 2.00x the clean one (IQR 2.00\u20132.09 over 5 repeats" in text(res)


def test_the_summary_states_the_ratio_only_when_its_spread_is_narrow():
    narrow = A.cost_summary([1.0] * 5, [1.00, 1.02, 0.98, 1.05, 1.01])
    assert narrow["cost_stated"] and narrow["cost_ratio"] == pytest.approx(1.01)
    assert (narrow["cost_ratio_q1"], narrow["cost_ratio_q3"]) == (pytest.approx(1.00), pytest.approx(1.02))
    # the numbers: a cold first forward and noise give ratios from 0.36 to 2.6 -- nothing can be said
    wide = A.cost_summary([1.0] * 5, [0.36, 1.7, 2.6, 1.0, 2.2])
    assert not wide["cost_stated"] and wide["cost_ratio"] == pytest.approx(1.7)
    # the rule: IQR at most 25% of the median
    assert A.cost_summary([1.0] * 5, [1.0, 0.9, 1.0, 1.15, 1.0])["cost_stated"]  # quartiles 1.0 and 1.0: outliers aside
    assert A.cost_summary([1.0] * 4, [0.8, 0.8, 1.2, 1.2])["cost_stated"] is False  # IQR 0.3 of a median 1.0
    assert A.cost_summary([1.0] * 4, [0.9, 0.9, 1.1, 1.1])["cost_stated"] is True  # IQR 0.15
    none = A.cost_summary([], [])
    assert none["cost_repeats"] == 0 and not none["cost_stated"] and math.isnan(none["cost_ratio"])


def meta_of(summary: dict) -> dict:
    return {**summary, "wall_s": 12.3}


def test_the_cost_line_states_the_ratio_with_its_spread_or_says_it_cannot():
    stated = cost_line(meta_of(A.cost_summary([0.10] * 5, [0.102, 0.100, 0.104, 0.101, 0.103])))
    assert stated.startswith("cost: ablated forward 1.02x the clean one (IQR 1.01\u20131.03 over 5 repeats;")
    assert stated.endswith("12.3 s in all")
    noisy = cost_line(meta_of(A.cost_summary([0.10] * 5, [0.036, 0.17, 0.26, 0.10, 0.22])))
    assert noisy.startswith("cost: not stated, the ablated / clean time ratio varied too much over 5 repeats")
    assert "1.70x" not in noisy and "0.36x" not in noisy
    # a result written before the repeated measure: its one-pass numbers, said to be so
    old = cost_line({"cost_ratio": 0.36, "ablated_forward_s": 0.01, "clean_forward_s": 0.028, "wall_s": 1.0})
    assert "one pass, not warmed up" in old
    assert cost_line({"wall_s": 1.0}) is None
