"""Repeated ``--seeds`` (or ``--variants``) are refused before any training, in one line naming the flag
and its values (exit 2); ``--quiet`` keeps the lock's take-over note off stderr."""

import json
import os

import pytest

from probe.experiments.command import main
from probe.jobs.lock import LOCK_NAME

SP = ["--steps", "3", "--loads", "1", "--seeds", "0", "--n-eval", "64", "--keys", "blind", "--batch-size", "16"]


@pytest.mark.parametrize(
    ("recipe", "argv", "needle"),
    [
        ("sink-removal", ["--seeds", "0", "0"], "--seeds 0 0 names 0 more than once"),
        ("sink-removal", ["--seeds", "1", "0", "1"], "--seeds 1 0 1 names 1 more than once"),
        ("sink-emergence", ["--seeds", "3", "3"], "--seeds 3 3 names 3 more than once"),
        ("sink-removal", ["--variants", "baseline", "baseline"], "--variants baseline baseline names baseline"),
    ],
)
def test_repeated_values_are_one_line_before_training(tmp_path, capsys, recipe, argv, needle):
    out = tmp_path / "out"
    assert main([recipe, "--out", str(out), "--quiet", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0] and err[0].startswith(f"python -m probe.experiments {recipe}: error:")
    assert not out.exists()  # nothing trained, nothing written


def test_quiet_takes_over_a_killed_runs_lock_silently(tmp_path, capsys):
    out = tmp_path / "sp"
    out.mkdir()
    dead = {"pid": 2**22 - 1, "host": os.uname().nodename, "started": "2026-01-01T00:00:00+0000"}
    (out / LOCK_NAME).write_text(json.dumps(dead))
    (out / ".probe-tmp-config.json.x").write_text("half")  # a killed run's staged file
    assert main(["superposition", "--out", str(out), "--quiet", *SP]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert not (out / LOCK_NAME).exists() and (out / "config.json").is_file()
    # without --quiet the take-over is noted
    (out / LOCK_NAME).write_text("not a lock record")
    assert main(["superposition", "--out", str(out), *SP]) == 0
    assert "taking over the lock" in capsys.readouterr().err
