"""Behaviour pinned by golden files: every verb's CSV and JSON on every shipped zoo model it accepts (and `probe view`'s
page figures and stdout line), as written by `scripts/golden/make_golden.py` at the commit recorded in
tests/jobs/golden/cases.json. Equal, or within fp32 rounding: the models run in fp32, and the same forward on another
CPU (other kernel blocking) moves the numbers by up to 5e-6 relative, a loss difference (delta) by up to 5e-8 absolute,
so floats compare within 1e-4 relative or 1e-6 absolute (measured on the Xeon that found it, 2026-12-05). An
injection's quiet set turns on the order of read norms that are equal in exact arithmetic and a few ulps apart by the
CPU's matmul blocking (one case's corrupted loss moved 1.2% between a Xeon and an AVX2-only EPYC): the recording keeps
each injection's order (golden/quiet-orders/) and the rerun cuts by it, after checking that it orders this machine's
norms to within 1e-5 relative (make_golden.quiet_orders)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from tests.support.scripts import load_script

GOLDEN = Path(__file__).resolve().parent / "golden"
make_golden = load_script("scripts/golden/make_golden.py", "make_golden")  # the same run and read-back as the recording
CASES = json.loads((GOLDEN / "cases.json").read_text())["cases"]
RTOL, ATOL = 1e-4, 1e-6  # fp32 rounding across CPUs (module docstring)


def _close(a, b, where: str) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        assert sorted(a) == sorted(b), f"{where}: keys {sorted(a)} != {sorted(b)}"
        for k in a:
            _close(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), f"{where}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and isinstance(b, (int, float)) and not isinstance(b, bool):
        if math.isnan(a):
            assert math.isnan(b), f"{where}: nan != {b}"
        else:
            assert math.isclose(a, b, rel_tol=RTOL, abs_tol=ATOL) or a == b, f"{where}: {a!r} != {b!r}"
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def _compare_csv(golden: Path, fresh: Path) -> None:
    want, got = pd.read_csv(golden), pd.read_csv(fresh)
    assert list(want.columns) == list(got.columns), f"{golden.name}: columns differ"
    assert len(want) == len(got), f"{golden.name}: {len(want)} rows != {len(got)}"
    for col in want.columns:
        w, g = want[col], got[col]
        if pd.api.types.is_float_dtype(w) or pd.api.types.is_float_dtype(g):
            _close(w.astype(float).tolist(), g.astype(float).tolist(), f"{golden.name}:{col}")
        else:
            assert w.tolist() == g.tolist(), f"{golden.name}:{col} differs"


@pytest.mark.parametrize("case", sorted(CASES))
def test_verb_outputs_equal_the_golden_files(case, tmp_path):
    spec = CASES[case]
    out = tmp_path / "out"
    orders = make_golden.load_orders(GOLDEN / make_golden.QUIET_ORDERS / f"{case}.safetensors")
    with make_golden.quiet_orders(replay=orders) as taken:  # an injection cuts its quiet sets as recorded
        code, said = make_golden.run_case(spec["argv"], out)
    assert orders is not None or not taken, f"{case} injects but its quiet orders were not recorded"
    assert code == spec["exit"]
    if spec["exit"] != 0:
        return
    want_dir = GOLDEN / case
    want = sorted(p.relative_to(want_dir) for p in want_dir.rglob("*") if p.is_file())
    derived = tmp_path / "derived"  # what the recording derives from the outputs: page figures, stdout
    for name, text in make_golden.recorded(out, said).items():
        (derived / name).parent.mkdir(parents=True, exist_ok=True)
        (derived / name).write_text(text, encoding="utf-8")
    fresh = {p.relative_to(out): p for p in make_golden.kept(out)}
    fresh |= {p.relative_to(derived): p for p in derived.rglob("*") if p.is_file()}
    assert sorted(fresh) == want
    for rel in want:
        if rel.suffix == ".csv":
            _compare_csv(want_dir / rel, fresh[rel])
        elif rel.suffix == ".json":
            want_json, got_json = (make_golden.decoded(json.loads(p.read_text())) for p in (want_dir / rel, fresh[rel]))
            _close(want_json, got_json, str(rel))
        else:
            assert fresh[rel].read_text(encoding="utf-8") == (want_dir / rel).read_text(encoding="utf-8"), str(rel)


def test_a_recorded_quiet_order_is_replayed_only_where_it_orders_this_machines_norms():
    """Reads tied in exact arithmetic may come out a few ulps apart in either order: the recorded order replays; an
    order that puts a read before one smaller by more than rounding is refused, naming the call."""
    norms = torch.tensor([2.0, 1.0, 1.0 + 1e-7, 3.0]).view(1, 4, 1)  # (B, T, Hkv): reads 1 and 2 a near-tie
    swapped = torch.tensor([2, 1, 0, 3]).view(1, 4, 1)  # read 2 before read 1, as another CPU rounded them
    rank, problem = make_golden._recorded_rank({"0": swapped}, 0, norms)
    assert problem is None and torch.equal(rank, swapped)
    wrong = torch.tensor([1, 2, 0, 3]).view(1, 4, 1)  # read 0 (2.0) before read 2 (1.0): not rounding
    rank, problem = make_golden._recorded_rank({"0": wrong}, 0, norms)
    assert rank is None and "call 0" in problem and "misorders" in problem
    assert "recording has None" in make_golden._recorded_rank({}, 3, norms)[1]
    twice = torch.tensor([0, 0, 1, 3]).view(1, 4, 1)  # not a permutation: a damaged recording
    assert "not an order" in make_golden._recorded_rank({"0": twice}, 0, norms)[1]
