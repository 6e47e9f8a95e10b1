"""``probe.checkpoints.wrap(obj)`` as docs/python.md shows it: after a plain ``import probe`` (no ``import
probe.checkpoints``), in a fresh interpreter; reaching ``probe.checkpoints`` imports neither torch nor transformers,
only calling a name of it does."""

from __future__ import annotations

import subprocess
import sys

from tests.support.cli import ENV

HEAVY = "sorted(m for m in ('torch', 'transformers', 'transformer_lens') if m in sys.modules)"


def test_wrap_after_a_plain_import_probe():
    code = f"""
import sys
import probe
before = {HEAVY}
checkpoints = probe.checkpoints
after = {HEAVY}
from probe.checkpoints.tiny import tiny_model
model = probe.checkpoints.wrap(tiny_model("llama"), name="mine")
print(before, after, type(model).__name__, model.probe_info.name, model.probe_info.n_layers)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV)
    assert r.returncode == 0, r.stderr
    before, after, rest = r.stdout.strip().split("] ", 2)
    assert before == "[" and after == "[", r.stdout  # neither import probe nor probe.checkpoints loads torch
    assert rest.split()[1:] == ["mine", "2"], r.stdout
