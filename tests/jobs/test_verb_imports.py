"""An analysis verb does not import the trainer: ``probe sinks`` (and the torchrun path every analysis verb takes)
runs without the training loop, optimisers, schedules, checkpointing or the trainer's DDP in the process. The one
part of ``probe.train`` the command line reads is ``probe.train.config`` (``TrainConfig``, torch-free: the parser
builds ``probe train``'s flags from it), and the package's own names load only on first use."""

from __future__ import annotations

import json
import subprocess
import sys

# Runs the verb in a fresh interpreter (this one has imported whatever other tests needed), then the module that
# puts a verb under torchrun, and reports what was imported.
PROGRAM = """
import json, sys
from probe.cli.main import main
code = main(["sinks", "--model", "probe/tiny-baseline", "--batches", "1", "--batch-size", "2", "--ctx", "16",
             "--quiet", "--out", sys.argv[1]])
import probe.cli.distributed
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


def test_the_sinks_verb_imports_no_trainer_module(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(tmp_path / "out")], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["code"] == 0 and (tmp_path / "out").is_dir()
    modules = report["modules"]
    assert "probe.analyses.sinks" in modules and "probe.cli.distributed" in modules  # the verb's path did run
    trainer = [m for m in modules if m.startswith("probe.train.") and m != "probe.train.config"]
    assert trainer == []
