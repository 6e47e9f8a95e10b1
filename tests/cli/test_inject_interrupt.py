"""`probe inject --out DIR` stopped by Ctrl-C (SIGINT) or SIGTERM keeps its finished batches in DIR/.partial/inject/,
says so in one line and exits 130 / 143 with the folder's lock released; the same command run again reloads those
batches instead of recomputing them and writes the files an uninterrupted run writes, byte for byte.

The `probe` command runs in a subprocess on the bundled tiny model, four batches of two 32-token windows. A
``sitecustomize`` (tests.support.cli.patched) logs each batch the subprocess computes and, when asked, holds it at
one batch so that a signal arrives while that batch is running."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.cli import ENV, assert_one_line_error, patched, probe, terminal_lines

ARGS = ["inject", "--batches", "4", "--batch-size", "2", "--ctx", "32", "--dose", "0.4"]
PARTIAL = Path(".partial") / "inject"

# logs the batch index of every corrupted pass to $PROBE_TEST_LOG; holds the batch $PROBE_TEST_HOLD (if set) until a
# signal ends the process
HOOK = """
import os, time
import probe.analyses.inject as inject

_real = inject._corrupted_losses

def _corrupted_losses(model, ids, tgt, chunk, seed, batch, *rest):
    with open(os.environ["PROBE_TEST_LOG"], "a") as f:
        f.write(f"{batch}\\n")
    if str(batch) == os.environ.get("PROBE_TEST_HOLD"):
        time.sleep(120)
    return _real(model, ids, tgt, chunk, seed, batch, *rest)

inject._corrupted_losses = _corrupted_losses
"""


def hooked(tmp_path: Path, log: Path, hold: int | None = None) -> dict[str, str]:
    env = {**patched(tmp_path, HOOK), "PROBE_TEST_LOG": str(log)}
    if hold is not None:
        env["PROBE_TEST_HOLD"] = str(hold)
    return env


def logged(log: Path) -> list[int]:
    return [int(x) for x in log.read_text().split()] if log.exists() else []


def results(out: Path) -> dict[str, bytes]:
    """The files whose bytes a run determines: every CSV and the JSON document (the page holds random plotly ids)."""
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.suffix in (".csv", ".json")}


def interrupted(tmp_path: Path, out: Path, sig: int, hold: int, wait_for: Path | None, args=ARGS):
    """Run `probe ARGS --out OUT`, held at batch ``hold``; once ``wait_for`` exists (or the held batch has started),
    send ``sig``; the finished process."""
    log = tmp_path / "interrupted.log"
    cmd = [sys.executable, "-m", "probe.cli", *args, *(["--out", str(out)] if out is not None else [])]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**ENV, **hooked(tmp_path, log, hold)}
    )
    try:
        deadline = time.monotonic() + 90
        while not (hold in logged(log) and (wait_for is None or wait_for.exists())):
            assert proc.poll() is None, f"ended before the signal: {proc.returncode}, {proc.stderr.read().decode()}"
            assert time.monotonic() < deadline, "the held batch never started"
            time.sleep(0.05)
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout.decode(), stderr.decode())


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[str, bytes]:
    out = tmp_path_factory.mktemp("uninterrupted") / "out"
    r = probe(*ARGS, "--out", out)
    assert r.returncode == 0, r.stderr
    assert not (out / ".partial").exists()
    return results(out)


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupted_run_keeps_its_batches_and_the_same_command_resumes(tmp_path, uninterrupted, sig, code):
    out = tmp_path / "out"
    r = interrupted(tmp_path, out, sig, hold=2, wait_for=out / PARTIAL / "batch-00001.json")
    assert r.returncode == code, r.stderr
    lines = terminal_lines(r.stderr)
    assert lines[-1] == "probe inject: interrupted after 2 of 4 batches; rerun the same command to resume"
    assert "probe: interrupted" not in r.stderr and "Traceback" not in r.stderr
    kept = sorted(p.name for p in (out / PARTIAL).iterdir())
    assert kept == ["batch-00000.json", "batch-00001.json", "settings.json"]
    assert not (out / ".probe.lock").exists()  # the lock was released
    assert not list(out.glob("*.csv")) and not list(out.glob(".probe-tmp-*"))

    if sig == signal.SIGINT:  # other settings: refused in one line, the kept batches untouched
        mismatch = probe(*ARGS[:-1], "0.8", "--out", out, "--quiet")
        assert_one_line_error(mismatch, "probe inject: error:", "other settings", "doses", "0.4", "0.8")
        assert sorted(p.name for p in (out / PARTIAL).iterdir()) == kept

    log = tmp_path / "resumed.log"
    again = probe(*ARGS, "--out", out, env=hooked(tmp_path, log))
    assert again.returncode == 0, again.stderr
    assert "resuming" in again.stderr and "2 of 4 batches already done" in again.stderr
    assert logged(log) == [2, 3]  # batches 0 and 1 were reloaded, not recomputed
    assert results(out) == uninterrupted  # every CSV and the JSON, byte for byte
    assert not (out / ".partial").exists()


def test_without_out_an_interrupt_is_one_line_as_before(tmp_path):
    r = interrupted(tmp_path, None, signal.SIGINT, hold=0, wait_for=None)
    assert r.returncode == 130, r.stderr
    assert terminal_lines(r.stderr)[-1] == "probe: interrupted"


def test_the_python_api_resumes_from_a_partial_state_to_the_same_numbers(tmp_path, monkeypatch):
    """``inject(state=...)``: a run stopped after two of four batches, resumed, equals one uninterrupted run exactly
    (every table, every float), and reloads the finished batches instead of recomputing them."""
    import probe.analyses.inject as inject_module
    from probe.errors import UsageError
    from probe.jobs.partial import BatchState
    from tests.support.analyses import tiny, windows

    model, data = tiny("baseline"), windows(4, 2, 12)
    kw = dict(junk=["structured", "gaussian"], cutoffs=["q25", "median"], doses=[0.0, 0.4], progress=False)
    whole = inject_module.inject(model, data, **kw)

    real, computed = inject_module._corrupted_losses, []

    def stop_at_batch_2(model, ids, tgt, chunk, seed, batch, *rest):
        computed.append(batch)
        if batch == 2:
            raise KeyboardInterrupt
        return real(model, ids, tgt, chunk, seed, batch, *rest)

    monkeypatch.setattr(inject_module, "_corrupted_losses", stop_at_batch_2)
    state = BatchState(tmp_path, "inject", {"caller": "test"})
    with pytest.raises(KeyboardInterrupt):
        inject_module.inject(model, data, state=state, **kw)
    assert state.done() == [0, 1] and state.total == 4

    with pytest.raises(UsageError, match="other settings"):  # another seed: refused, nothing mixed
        inject_module.inject(model, data, state=BatchState(tmp_path, "inject", {"caller": "test"}), seed=1, **kw)

    computed.clear()  # resumed: batches 0 and 1 reloaded, 2 and 3 computed
    monkeypatch.setattr(inject_module, "_corrupted_losses", lambda *a: computed.append(a[5]) or real(*a))
    resumed = inject_module.inject(model, data, state=BatchState(tmp_path, "inject", {"caller": "test"}), **kw)
    assert sorted(set(computed)) == [2, 3]
    assert whole.keys() == resumed.keys()
    for name in whole:
        assert whole[name].to_csv(index=False) == resumed[name].to_csv(index=False), name
