"""A kill at any write boundary of `probe experiment sink-removal` and of `probe train` resumes, on the same command, to
the files an uninterrupted run leaves, byte for byte.

A write boundary is each point where the run puts something into place on disk: every ``os.replace`` / ``os.rename``
(``probe.writes.write_files`` and ``atomic_write``, the checkpoint and snapshot folder swaps of probe.train.checkpoint)
and every ``probe.writes.append_line`` (metrics.jsonl, timing.jsonl). An uninterrupted run is recorded first, counting
its K boundaries; then for each boundary k a run of the same command dies there (``os._exit(137)``, as ``kill -9``: no
``finally``, no cleanup, the lock dropped by the kernel), right after the k-th commit and, where that is a distinct
state on disk (a temp file or folder staged since the previous boundary), right before it; the same command then runs
again, unpatched, to completion, and its folder must hold the same files as the uninterrupted run's.

Every run is a process of its own calling ``probe.cli.main.main`` on the command line, forked from one interpreter that
has imported probe once (a fresh interpreter takes ~5 s to import torch and plotly; a forked run of these tiny
settings well under a second). The uninterrupted reference run is a real ``python -m probe.cli`` subprocess, so the
forked runs are checked against a fresh interpreter too.

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

from tests.support.cli import ENV, REPO

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

# One interpreter imports probe, then forks a process per run. A job (one JSON line on stdin): the command line, the
# folder it runs in, and a mode: "run" (unpatched), "record" (every boundary logged with a fingerprint of the folder's
# state before and after it) or "kill" (os._exit(137) before or after boundary k, after noting which one it was).
ZYGOTE = r"""
import hashlib, json, os, sys, traceback

proto = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)  # what the imports print goes to stderr, never into the protocol
from probe.cli.main import main as cli_main
import probe.writes as writes
import probe.cli.train, probe.experiments.command, probe.experiments.sink_removal  # noqa: F401
import probe.present.training, probe.train.trainer  # noqa: F401

TEMP = writes.TEMP_PREFIX
RANDOM = 8  # the random tail mkstemp / mkdtemp give a staged name


def normal(rel):
    return "/".join(p[:-RANDOM] + "*" if p.startswith(TEMP) else p for p in rel.split(os.sep))


def fingerprint(root):
    h = hashlib.sha256()
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        h.update(b"D" + normal(os.path.relpath(folder, root)).encode())
        for name in sorted(files):
            path = os.path.join(folder, name)
            h.update(b"F" + normal(os.path.relpath(path, root)).encode())
            with open(path, "rb") as f:
                h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()


def checkpoint_step(root):  # the newest complete checkpoint's step under root (checkpoint/, checkpoint.old/), or None
    steps = []
    for folder, dirs, files in os.walk(root):
        if os.path.basename(folder) in ("checkpoint", "checkpoint.old") and "trainer_state.json" in files:
            with open(os.path.join(folder, "trainer_state.json")) as f:
                steps.append(json.load(f)["step"])
    return max(steps, default=None)


def install(job):
    mode, root, count, events = job["mode"], os.path.join(job["cwd"], "out"), [0], []
    real_replace, real_rename, real_append = os.replace, os.rename, writes.append_line

    def boundary(op, dst, commit):
        count[0] += 1
        k, rel = count[0], normal(os.path.relpath(os.fspath(dst), job["cwd"]))
        if mode == "record":
            event = dict(k=k, op=op, dst=rel, existed=os.path.lexists(dst), before=fingerprint(root))
            event["ckpt_before"] = checkpoint_step(root)
            commit()
            events.append(dict(event, after=fingerprint(root), ckpt_after=checkpoint_step(root)))
            with open(job["events"], "w") as f:
                json.dump(events, f)
            return
        if k == job["k"] and job["when"] == "before":
            die(k, op, rel)
        commit()
        if k == job["k"] and job["when"] == "after":
            die(k, op, rel)

    def die(k, op, rel):
        fd = os.open(job["died"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.write(fd, json.dumps([k, op, rel]).encode())
        os._exit(137)  # kill -9: no finally, no atexit, no flush

    def replace(src, dst, *a, **kw):
        return boundary("replace", dst, lambda: real_replace(src, dst, *a, **kw))

    def rename(src, dst, *a, **kw):
        return boundary("rename", dst, lambda: real_rename(src, dst, *a, **kw))

    def append_line(path, line):
        return boundary("append", path, lambda: real_append(path, line))

    os.replace, os.rename = replace, rename
    for module in list(sys.modules.values()):  # every `from probe.writes import append_line` binding
        if getattr(module, "append_line", None) is real_append:
            module.append_line = append_line


def child(job):
    os.chdir(job["cwd"])
    fd = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    if job["mode"] != "run":
        install(job)
    try:
        rc = cli_main(job["argv"])
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 2
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc or 0)


proto.write("@ready\n")
for line in iter(sys.stdin.readline, ""):
    job = json.loads(line)
    pid = os.fork()
    if pid == 0:
        try:
            child(job)
        except BaseException:
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(99)
    _, status = os.waitpid(pid, 0)
    proto.write("@" + json.dumps(os.waitstatus_to_exitcode(status)) + "\n")
"""


class Runner:
    """The forking interpreter: ``run(cwd, argv, mode, **job)`` runs one command in a process of its own, returns its
    exit code and its output."""

    def __init__(self):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", ZYGOTE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**ENV, "PYTHONPATH": str(REPO)},
            cwd=REPO,
            text=True,
        )
        assert self._answer() == "ready"

    def _answer(self) -> str:
        for line in iter(self.proc.stdout.readline, ""):
            if line.startswith("@"):
                return line[1:].strip()
        raise AssertionError(f"the forking interpreter ended (exit code {self.proc.wait()})")

    def run(self, cwd: Path, argv: list[str], mode: str = "run", **job) -> tuple[int, str]:
        cwd.mkdir(parents=True, exist_ok=True)
        log = cwd / f"{mode}.log"
        job = {"cwd": str(cwd), "argv": argv, "mode": mode, "log": str(log), **job}
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        return int(self._answer()), log.read_text(errors="replace")

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


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
