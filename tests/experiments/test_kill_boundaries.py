"""A kill at any write boundary of `probe experiment sink-removal` and of `probe train` resumes, on the same command, to
the files an uninterrupted run leaves, byte for byte.

A write boundary is each point where the run puts something into place on disk: every ``os.replace`` / ``os.rename``
(``probe.writes.write_files`` and ``atomic_write``, the checkpoint and snapshot folder swaps of probe.train.checkpoint)
and every ``probe.writes.append_line`` (metrics.jsonl, timing.jsonl). An uninterrupted run is recorded first, counting
its K boundaries; then for each boundary k a run of the same command dies there (``os._exit(137)``, as ``kill -9``: no
``finally``, no cleanup, the lock dropped by the kernel), right after the k-th commit and, where that is a distinct
state on disk (a temp file or folder staged since the previous boundary), right before it; the same command then runs
again, unpatched, to completion, and its folder must hold the same files as the uninterrupted run's.

Every run is a process of its own running ``probe.cli`` on the command line, forked from a zygote that has imported
probe once (tests/support/forked_cli.py, preloading tests/support/write_boundaries.py, whose ``install`` patches the
boundaries; a fresh interpreter takes ~5 s to import torch and plotly, a forked run of these tiny settings well under
a second). The uninterrupted reference run is a real ``python -m probe.cli`` subprocess, so the forked runs are
checked against a fresh interpreter too.

What the comparison leaves out, as it must (two uninterrupted runs differ there too):

* the values of wall- and CPU-time measurements and peak memory (``TIME_KEYS``: ``tokens_per_s`` in metrics.jsonl and
  the checkpoint's trainer_state.json; ``wall_s``, ``train_cpu_s``, ``peak_rss_mb*`` in config.json, runs.csv,
  removal_stats.json and the pages' settings tables): the key stays, its number is masked;
* plotly's random ``<div id>`` in each HTML page;
* ``timing.jsonl`` (sink-removal's per-run log of each training call's CPU and wall seconds: a resumed run logs one
  line per call by design, and sums them); its last line's step is checked instead;
* ``.probe.lock`` (the lock file; a finished command removes it, so it is absent on both sides anyway).

Everything else -- weights, optimizer and RNG states, every loss, every table cell, every page byte -- must be equal.

The settings are the smallest that still reach every kind of boundary (a fresh start, a resume from a mid-run
checkpoint and its swap over the previous one, a finished run, the result pages): one run of two steps with a
checkpoint and a snapshot at every step. Each kill point is labelled with its kind (the operation, the file it puts in
place, and what the rerun will find: no checkpoint, a mid-run one, or the final one), which the test prints with -s.
"""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.support import forked_cli
from tests.support.cli import ENV, REPO

PRELUDE = "tests.support.write_boundaries"  # what each killed or recording run installs before the command

SINK_REMOVAL = [
    "experiment",
    "sink-removal",
    "--out",
    "out",
    "--variants",
    "baseline",
    "--seeds",
    "0",
    "--steps",
    "2",
    "--snapshot-every",
    "1",
    "--warmup",
    "1",
    "--T",
    "8",
    "--batch-size",
    "2",
    "--d-model",
    "16",
    "--d-mlp",
    "16",
    "--vocab",
    "8",
    "--triggers",
    "1",
    "--n-eval-batches",
    "1",
    "--eval-batch-size",
    "2",
    "--quiet",
]
TRAIN = [
    "train",
    "--data",
    "synthetic:bb[vocab=8,triggers=1]",
    "--ctx",
    "8",
    "--steps",
    "2",
    "--batch-size",
    "2",
    "--eval-batches",
    "1",
    "--eval-every",
    "1",
    "--ckpt-every",
    "1",
    "--snapshot-every",
    "1",
    "--threads",
    "1",
    "--quiet",
    "--out",
    "out",
]
COMMANDS = {"sink-removal": SINK_REMOVAL, "train": TRAIN}

TIME_KEYS = (
    "tokens_per_s",
    "wall_s",
    "cpu_s",
    "train_cpu_s",
    "train_wall_s",
    "measure_wall_s",
    "peak_rss_mb",
    "peak_rss_mb_run",
    "peak_rss_mb_parent",
)
SKIPPED = ("timing.jsonl", ".probe.lock")


class Runner:
    """A zygote (tests/support/forked_cli.py) that has imported probe and tests/support/write_boundaries.py:
    ``run(cwd, argv, mode, **job)`` runs one command in a process of its own forked from it, "run" unpatched,
    "record" or "kill" with its write boundaries patched (write_boundaries.install), and returns its exit code and
    its output."""

    def __init__(self):
        preload = (*forked_cli.PRELOAD, PRELUDE)
        self.zygote = forked_cli.Zygote({**ENV, "PYTHONPATH": str(REPO)}, preload=preload)

    def run(self, cwd: Path, argv: list[str], mode: str = "run", **job) -> tuple[int, str]:
        cwd.mkdir(parents=True, exist_ok=True)
        job = {"cwd": str(cwd), "mode": mode, **job}
        prelude = None if mode == "run" else PRELUDE
        r = self.zygote.run(argv, str(cwd), timeout=600, prelude=prelude, job=job)
        return r.returncode, (r.stdout + r.stderr).decode(errors="replace")

    def close(self):
        self.zygote.close()


@pytest.fixture(scope="module")
def runner():
    r = Runner()
    yield r
    r.close()


_UUID = re.compile(rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_TIME_JSON = re.compile(rb'("(?:' + b"|".join(k.encode() for k in TIME_KEYS) + rb')": )[-0-9.eE+]+')
_TIME_ROW = re.compile(rb"(<tr><th>(?:" + b"|".join(k.encode() for k in TIME_KEYS) + rb")</th><td>)[^<]*")


def masked(path: Path) -> bytes:
    """``path``'s bytes with the time measurements' numbers (and plotly's random div ids) masked."""
    data = path.read_bytes()
    if path.suffix in (".json", ".jsonl"):
        return _TIME_JSON.sub(rb"\1T", data)
    if path.suffix == ".html":
        return _TIME_ROW.sub(rb"\1T", _UUID.sub(b"UUID", data))
    if path.suffix == ".csv":
        rows = list(csv.reader(io.StringIO(data.decode("utf-8"))))
        timed = {i for i, name in enumerate(rows[0] if rows else []) if name in TIME_KEYS}
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows(
            [["T" if i in timed else v for i, v in enumerate(r)] for r in rows]
        )
        return buf.getvalue().encode()
    return data


def folder(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): masked(p) for p in sorted(root.rglob("*")) if p.is_file() and p.name not in SKIPPED
    }


def assert_same_files(got: Path, want: Path, what: str) -> None:
    a, b = folder(got), folder(want)
    assert sorted(a) == sorted(b), f"{what}: files differ: only here {sorted(set(a) - set(b))}, only in the " + (
        f"uninterrupted run {sorted(set(b) - set(a))}"
    )
    differ = [name for name in a if a[name] != b[name]]
    assert not differ, f"{what}: contents differ: {differ}"
    for timing in got.rglob("timing.jsonl"):  # the one file left out: it still ends with the finished step
        assert (
            json.loads(timing.read_text().splitlines()[-1])["step"]
            == json.loads((want / timing.relative_to(got)).read_text().splitlines()[-1])["step"]
        )


_RECORDED: dict[str, tuple[Path, list[dict]]] = {}


def recorded(name: str, runner: Runner, tmp_path_factory) -> tuple[Path, list[dict]]:
    """(the uninterrupted run's folder, its write boundaries in order), once per command."""
    if name not in _RECORDED:
        base = tmp_path_factory.mktemp(f"uninterrupted-{name}")
        (base / "ref").mkdir()
        r = subprocess.run(
            [sys.executable, "-m", "probe.cli", *COMMANDS[name]],
            cwd=base / "ref",
            env={**ENV, "PYTHONPATH": str(REPO)},
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert r.returncode == 0, r.stderr[-3000:]
        events = base / "events.json"
        rc, log = runner.run(base / "record", COMMANDS[name], "record", events=str(events))
        assert rc == 0, log[-3000:]
        # the forked, recording run writes what a fresh interpreter writes (and the run is deterministic)
        assert_same_files(base / "record" / "out", base / "ref" / "out", f"{name}: a second uninterrupted run")
        _RECORDED[name] = (base / "ref" / "out", json.loads(events.read_text()))
    return _RECORDED[name]


def kill_points(events: list[dict]) -> list[tuple[int, str, str]]:
    """(k, "before" | "after", kind) for every boundary: after each commit, and before it where the folder then
    differs from what the previous boundary left (something was staged in between). The kind: the operation, the
    file it puts into place (step numbers generalised), whether it replaces one, and what the rerun will do with the
    folder as the kill leaves it (start afresh, resume from a checkpoint, or find the training finished)."""
    final = max((e["ckpt_after"] for e in events if e["ckpt_after"] is not None), default=None)

    def phase(step):
        return "afresh" if step is None else "finished" if step == final else "resumes"

    points, previous = [], None
    for e in events:
        dst = re.sub(r"step\d+", "stepN", e["dst"])
        kind = f"{e['op']} {dst}{' (over one)' if e['existed'] else ''}"
        if e["before"] != previous:
            points.append((e["k"], "before", f"{kind} [{phase(e['ckpt_before'])}]"))
        points.append((e["k"], "after", f"{kind} [{phase(e['ckpt_after'])}]"))
        previous = e["after"]
    return points


@pytest.mark.parametrize("name", COMMANDS)
def test_a_kill_at_every_write_boundary_resumes_to_the_uninterrupted_files(name, runner, tmp_path_factory):
    reference, events = recorded(name, runner, tmp_path_factory)
    points = kill_points(events)
    kinds = Counter(kind for _, _, kind in points)
    print(f"\n{name}: {len(events)} write boundaries, {len(points)} kill points:")
    print("\n".join(f"  {n} x {kind}" for kind, n in kinds.items()))
    base = tmp_path_factory.mktemp(f"killed-{name}")
    for k, when, kind in points:
        at, what = base / f"{when}{k}", f"{name} killed {when} boundary {k} of {len(events)} ({kind})"
        rc, log = runner.run(at, COMMANDS[name], "kill", k=k, when=when, died=str(at / "died.json"))
        assert rc == 137, f"{what}: the run did not reach that boundary (exit code {rc}): {log[-2000:]}"
        assert json.loads((at / "died.json").read_text())[0] == k
        rc, log = runner.run(at, COMMANDS[name])  # the same command again, to completion
        assert rc == 0, f"{what}: the rerun failed (exit code {rc}): {log[-3000:]}"
        assert_same_files(at / "out", reference, what)
        shutil.rmtree(at)
