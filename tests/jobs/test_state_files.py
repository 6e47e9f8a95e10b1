"""Lock and state files a hostile or unlucky user leaves behind (docs/reliability.md): content that cannot be parsed is
a killed run's, taken over with one note; a run never touches another run's locked folder; --quiet leaves nothing on
stderr but an error line; a full disk at the lock names the lock file and leaves no new folder. Every CLI call runs in
this process (``probe.cli.main``)."""

from __future__ import annotations

import errno
import json
import os

import pytest

import probe.jobs.lock as lock_module
from probe.cli.main import main
from probe.jobs.lock import LOCK_NAME, acquire, this_host
from probe.writes import TEMP_PREFIX


def run(capsys, *args):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, [line for line in err.splitlines() if line.strip()]


@pytest.mark.parametrize(
    "content, why",
    [
        ('{"pid": "abc", "host": "HOST"}', "its pid 'abc' is not a process id"),
        ('{"pid": 99999999999999999999999, "host": "HOST"}', "is not a process id"),
        ('{"pid": -1, "host": "HOST"}', "its pid '-1' is not a process id"),
        ('{"pid": 0}', "its pid '0' is not a process id"),
        ('{"pid": true}', "is not a process id"),
        ('{"pid": [1], "host": ["x"]}', "is not a process id"),
        ('{"pid": 12, "host": 7}', "its host, start or command is not text"),
        ("[1, 2]", "it is not a JSON object"),
        ("\x00\xff garbage", "it is not JSON"),
        ("[" * 100_000, "it is not JSON"),
    ],
)
def test_a_lock_file_that_is_no_lock_record_is_taken_over_with_one_note(tmp_path, capsys, content, why):
    """A PID that is not a number or too large was a ValueError / OverflowError; a list host read as another host."""
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_NAME).write_bytes(content.replace("HOST", this_host()).encode("utf-8", "surrogateescape"))
    code, _, err = run(capsys, "costs", "--out", out)
    assert code == 0, err
    notes = [line for line in err if not line.startswith("wrote ")]
    assert len(notes) == 1 and "taking over the lock" in notes[0] and why in notes[0], err
    assert (out / "costs.json").is_file() and not (out / LOCK_NAME).exists()


def test_quiet_means_no_note_after_a_kill(tmp_path, capsys):
    """After a kill -9 the next --quiet run printed the takeover and the clean-up notes."""
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_NAME).write_text(json.dumps({"pid": 4_000_000, "host": this_host(), "command": "probe costs"}))
    (out / f"{TEMP_PREFIX}costs.csv.abc").write_text("half")
    code, _, err = run(capsys, "costs", "--out", out, "--quiet")
    assert code == 0 and err == []
    assert not (out / f"{TEMP_PREFIX}costs.csv.abc").exists()
    code, _, err = run(capsys, "costs", "--out", out)  # without --quiet the notes are there
    assert code == 0


def test_a_quiet_refusal_is_one_line(tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / LOCK_NAME).write_text(json.dumps({"pid": 4242, "host": "other-node", "command": "probe x"}))
    code, _, err = run(capsys, "costs", "--out", tmp_path / "out", "--quiet")
    assert code == 2 and len(err) == 1 and "another host" in err[0]


def test_a_full_disk_at_the_lock_names_the_lock_file_and_leaves_no_folder(tmp_path, capsys, monkeypatch):
    """It said 'cannot write a file: No space left on device' and left a new --out holding an empty .probe.lock."""

    def no_space(*args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(lock_module.os, "pwrite", no_space)
    out = tmp_path / "new" / "run"
    code, _, err = run(capsys, "costs", "--out", out)
    assert code == 1 and err == [f"probe costs: error: cannot write {out / LOCK_NAME}: No space left on device"]
    assert not (tmp_path / "new").exists()


def test_a_run_never_removes_what_a_live_run_stages_in_its_own_locked_subfolder(tmp_path, capsys):
    """`probe costs --out D` removed the checkpoint staging of a live `probe train --out D/run` (which then died)."""
    parent, child = tmp_path / "D", tmp_path / "D" / "run"
    (child / "checkpoint").mkdir(parents=True)
    live = [child / f"{TEMP_PREFIX}checkpoint.x1", child / "checkpoint" / f"{TEMP_PREFIX}model.safetensors.y2"]
    (parent / "models").mkdir()
    stale = [parent / f"{TEMP_PREFIX}costs.json.k2", parent / "models" / f"{TEMP_PREFIX}m.json.z3"]
    for p in stale:
        p.write_text("a killed run's")
    with acquire(child, note=lambda line: None):  # the live run's lock, then what it stages
        live[0].mkdir()
        live[1].write_text("being written")
        code, _, err = run(capsys, "costs", "--out", parent)
        assert code == 0, err
        assert all(p.exists() for p in live)
    assert not any(p.exists() for p in stale)


def test_a_killed_runs_lock_file_in_a_subfolder_still_keeps_the_walk_out(tmp_path, capsys):
    """A subfolder with a lock file is another run's folder whether or not its run is alive: its next run cleans it."""
    parent = tmp_path / "D"
    (parent / "run").mkdir(parents=True)
    (parent / "run" / LOCK_NAME).write_text("")
    kept = parent / "run" / f"{TEMP_PREFIX}x.json.1"
    kept.write_text("")
    assert run(capsys, "costs", "--out", parent)[0] == 0
    assert kept.exists()
