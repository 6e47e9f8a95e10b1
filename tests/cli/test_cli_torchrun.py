"""`probe sinks|inject|gates|sources|eval` under torchrun (2 gloo ranks on CPU) write the files one process writes, to
floating-point tolerance; rank 0 alone prints; an error on any rank ends both ranks with exit 2 and one line.

Two torchrun launches in all (each costs two interpreters importing torch): this file run as the worker script, which
calls the CLI's ``main`` for every verb and error case in turn (the same path ``-m probe.cli`` takes), and one real
``torchrun -m probe.cli`` with a bad flag.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pandas as pd
import pytest

from tests.support.cli import ENV, REPO, build_fixtures, terminal_lines

# 3 batches of 2 windows: batches 0 and 2 on rank 0, batch 1 on rank 1
WINDOWS = ["--batches", "3", "--batch-size", "2", "--ctx", "32"]
VERBS = {
    "sinks": ["--model", "{sp}", "--massive"],
    "inject": ["--model", "{sp}", "--junk", "structured", "gaussian", "--dose", "0.4", "1.6"],
    "gates": ["--model", "{sp}", "--min-count", "2"],
    "sources": ["--model", "{ar}"],
    "eval": ["--model", "{sp}"],
}
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]


def flags(verb: str, fx: dict, out: Path) -> list[str]:
    return [verb, *(f.format(**fx) for f in VERBS[verb]), "--data", str(fx["data"]), *WINDOWS, "--out", str(out)]


def call(argv: list[str]) -> dict:
    """``probe ARGV`` in this process: exit code, stdout and stderr."""
    from probe.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return {"rc": rc, "stdout": out.getvalue(), "stderr": err.getvalue(), "end": time.time()}


def worker(root: Path) -> None:
    """One torchrun rank: every verb, then three failures (rank 0's --out, a model missing on both ranks, a fault on
    rank 1 alone while rank 0 loads fine); what each call printed and returned goes to root/rank{R}.json."""
    import torch
    import torch.distributed as dist

    import probe.cli.prepare as analyses  # where the analysis verbs load their model
    from probe.errors import UsageError

    torch.set_num_threads(1)
    # one group for all calls (the CLI uses a group it finds; gloo cannot be re-created under torchrun's store)
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank = int(os.environ["RANK"])
    fx = {k: root / "fx" / k for k in ("sp", "ar")} | {"data": root / "fx" / "small.txt"}
    calls = {verb: call(flags(verb, fx, root / "two" / verb)) for verb in VERBS}
    (root / "a_file").write_text("")
    calls["bad_out"] = call(flags("sinks", fx, root / "a_file" / "out"))
    calls["missing_model"] = call(
        [
            "eval",
            "--model",
            str(root / "no_such_model"),
            "--data",
            str(fx["data"]),
            *WINDOWS,
            "--out",
            str(root / "none"),
        ]
    )
    if rank == 1:  # this rank's model cannot be read; rank 0's can

        def fault(spec, console):
            calls["fault_time"] = time.time()
            raise UsageError(f"--model {spec.name!r}: fault injected on rank 1")

        analyses.load_model = fault
    calls["rank1_fault"] = call(flags("gates", fx, root / "fault"))
    (root / f"rank{rank}.json").write_text(json.dumps(calls))
    dist.destroy_process_group()


def close(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The worker's two ranks (one torchrun launch) and one process of each verb, over the same saved tiny models."""
    root = tmp_path_factory.mktemp("torchrun")
    fx = build_fixtures(root / "fx")
    # the repository, not its tests/ folder: tests/kernels would shadow the `kernels` package transformers imports
    env = {**ENV, "PYTHONPATH": os.pathsep.join([str(REPO), ENV.get("PYTHONPATH", "")])}
    proc = subprocess.run([*TORCHRUN, __file__, str(root)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads((root / f"rank{r}.json").read_text()) for r in (0, 1)]
    single = {verb: call([*flags(verb, fx, root / "one" / verb), "--quiet"]) for verb in VERBS}
    return root, ranks, single


@pytest.mark.parametrize("verb", list(VERBS))
def test_two_ranks_write_what_one_process_writes(runs, verb):
    root, ranks, single = runs
    assert single[verb]["rc"] == 0 and ranks[0][verb]["rc"] == ranks[1][verb]["rc"] == 0, (single, ranks)
    one, two = root / "one" / verb, root / "two" / verb
    names = sorted(p.name for p in one.iterdir())
    assert names == sorted(p.name for p in two.iterdir()) and f"{verb}.json" in names
    for name in names:
        if name.endswith(".csv"):
            a, b = pd.read_csv(one / name), pd.read_csv(two / name)
            assert len(a) > 0 or "massive" in name, name  # the tiny model has no massive activations to list
            pd.testing.assert_frame_equal(b, a, check_exact=False, rtol=1e-9, atol=1e-12, obj=name)
        elif name.endswith(".json"):
            assert close(json.loads((two / name).read_text()), json.loads((one / name).read_text())), name
    if verb == "inject":  # the per-batch table covers both ranks' batches, and exposure is there
        batches = pd.read_csv(two / "inject_per_batch.csv")["batch"]
        assert sorted(batches.unique()) == [0, 1, 2]
        assert (two / "inject_exposure.csv").is_file()
    # rank 0 printed the verb's text and notes; rank 1 nothing at all
    assert ranks[0][verb]["stdout"].strip() and ranks[0][verb]["stderr"].strip()
    assert ranks[1][verb]["stdout"] == ranks[1][verb]["stderr"] == ""


@pytest.mark.parametrize(
    "case, needle", [("bad_out", "a_file"), ("missing_model", "no_such_model"), ("rank1_fault", "rank 1: --model")]
)
def test_an_error_on_any_rank_ends_both_with_one_line(runs, case, needle):
    root, ranks, _ = runs
    assert ranks[0][case]["rc"] == ranks[1][case]["rc"] == 2
    lines = terminal_lines(ranks[0][case]["stderr"])
    assert len(lines) == 1 and lines[0].startswith("probe ") and needle in lines[0], ranks[0][case]["stderr"]
    assert ranks[1][case]["stderr"] == ranks[1][case]["stdout"] == ""
    assert not (root / "fault").exists() and not (root / "none").exists()
    if case == "rank1_fault":  # rank 0 had loaded its model: it left as soon as it learnt of rank 1's failure
        assert ranks[0][case]["end"] - ranks[1]["fault_time"] < 10


def test_a_bad_flag_under_torchrun_is_one_line_within_seconds(tmp_path):
    """The real launcher and entry point: `torchrun -m probe.cli sinks --bogus`, every rank's output kept apart."""
    start = time.time()
    proc = subprocess.run(
        [*TORCHRUN, "--log-dir", str(tmp_path), "--redirects", "3", "-m", "probe.cli", "sinks", "--bogus"],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    end = time.time()
    # from the ranks' start (their log folders are made as they are spawned) to torchrun's end; torchrun's own start
    # (importing torch) is not ours to time and takes many seconds on a loaded machine
    spawned = min(p.stat().st_mtime for p in tmp_path.rglob("attempt_0/*"))
    assert proc.returncode != 0 and end - spawned < 10 and end - start < 60, (
        end - spawned,
        end - start,
        proc.stderr[-2000:],
    )
    codes = [int(c) for c in re.findall(r"exitcode\s*:\s*(-?\d+)", proc.stderr)]
    # every rank exits 2, unless torchrun stopped it first (SIGTERM) on seeing another rank's exit 2
    assert 2 in codes and set(codes) <= {2, -15}, proc.stderr[-2000:]
    logs = {int(p.parent.name): p.read_text() for p in tmp_path.rglob("stderr.log")}
    assert sorted(logs) == [0, 1]
    lines = terminal_lines(logs[0])
    assert len(lines) == 1 and lines[0].startswith("probe sinks: error: unknown option '--bogus'"), logs[0]
    assert logs[1] == ""


if __name__ == "__main__":  # run by torchrun: one rank of the worker
    worker(Path(sys.argv[1]))
