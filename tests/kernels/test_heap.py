"""probe.kernels.heap.keep_freed_memory: after it, a large freed tensor's memory stays in the process and the next
allocation reuses it (glibc), where by default glibc hands it back to the OS and faults it in again; off under
PROBE_KEEP_FREED_MEMORY=0. Each case runs in a fresh process: the setting is process-wide and lasts."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's malloc only"
)

SCRIPT = """
import json, sys, torch
from probe.kernels.heap import keep_freed_memory

def rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

kept = keep_freed_memory() if sys.argv[1] == "keep" else None
base = rss_mb()
for step in range(3):  # a training loop's steady state: a block freed in one step, asked for again in the next
    x = torch.ones(64 << 20)  # 256 MB, every page touched
    del x
after_free = rss_mb()
y = torch.ones(64 << 20)
after_again = rss_mb()
print(json.dumps(dict(kept=kept, held=after_free - base, grew_again=after_again - after_free)))
"""


def run(mode: str, **env) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, env={**os.environ, **env}, check=True
    )
    return json.loads(done.stdout)


def test_by_default_a_freed_block_goes_back_and_faults_in_again():
    r = run("default")
    assert r["held"] < 50 and r["grew_again"] > 200  # MB: handed back, faulted in again


def test_kept_a_freed_block_stays_and_is_reused():
    r = run("keep")
    assert r["kept"] is True
    assert r["held"] > 200 and r["grew_again"] < 50  # MB: kept after the free, and the same pages serve the next


def test_turned_off_it_changes_nothing():
    r = run("keep", PROBE_KEEP_FREED_MEMORY="0")
    assert r["kept"] is False and r["held"] < 50 and r["grew_again"] > 200
