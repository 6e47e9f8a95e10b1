"""`probe doctor` without a GPU, the prepared GPU run's scripts, and the GPU kernel suite's arguments (all on CPU)."""

import subprocess
import sys

import pytest
import torch

from tests.support.cli import REPO, patched, probe

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without a GPU")
pytest.importorskip("triton")


def test_doctor_without_a_gpu_says_so_and_runs_the_interpreter_check():
    r = probe("doctor")
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout
    assert "no CUDA device" in out and "torch " in out and "triton " in out
    assert 'backend="auto" here (cpu' in out and "sink_attention        sdpa" in out
    assert "Triton interpreter" in out
    assert (
        "row rules             native: softpick, stick-breaking in C" in out or "row rules             torch (C" in out
    )
    for op in ("forward", "backward", "row_masses", "depth"):
        assert f"  {op} " in out, out
    assert "MISMATCH" not in out and "--arch sm_90" in out and out.rstrip().endswith("ok")


def test_doctor_exits_1_with_one_line_on_a_mismatch(tmp_path):
    # the interpreter check runs in its own process, which inherits this start-up code: no tolerance is met
    env = patched(tmp_path, "import probe.kernels.checks as c\nc.TOLERANCE.update(fp32=0.0)\n")
    r = probe("doctor", env=env)
    assert r.returncode == 1, (r.stdout[-2000:], r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("probe doctor: ") and "differs from the reference" in lines[0]
    assert "MISMATCH" in r.stdout


def test_doctor_bad_arch_is_one_line_naming_the_choices():
    r = probe("doctor", "--arch", "sm_75")
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "sm_75" in r.stderr and "sm_90" in r.stderr


def test_gpu_scripts_parse():
    for script in ("scripts/gpu/check.sh", "scripts/gpu/fetch_wheels.sh", "scripts/gpu/slim_tree.sh"):
        r = subprocess.run(["bash", "-n", str(REPO / script)], capture_output=True, text=True)
        assert r.returncode == 0, (script, r.stderr)
    text = (REPO / "scripts/gpu/check.sh").read_text()
    assert text.index("python3 -m probe.cli doctor") < text.index("python3 benchmarks/kernels_gpu.py")  # doctor first
    assert "ZOO_STEPS:-0}" in text  # the zoo is opt-in


def _suite(*args):
    return subprocess.run(
        [sys.executable, str(REPO / "benchmarks/kernels_gpu.py"), *args], capture_output=True, text=True, cwd=REPO
    )


def test_gpu_suite_plan_covers_1k_to_16k_for_each_shape_and_section():
    r = _suite("--dry-run")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    for section in ("sink", "fla", "masses", "depth"):
        rows = [line for line in lines if line.startswith(section + " ")]
        assert {line.split("T=")[1].split()[0] for line in rows} == {"1024", "2048", "4096", "8192", "16384"}
    assert any(line.startswith("sink    gemma") for line in lines) and lines[-1] == f"{len(lines) - 1} measurements"
    r = _suite("--dry-run", "--sections", "depth", "--T", "2048")
    assert r.returncode == 0 and all("T=2048" in line for line in r.stdout.splitlines()[:-1])


def test_gpu_suite_bad_arguments_and_no_gpu():
    r = _suite("--sections", "bogus")
    assert r.returncode == 2 and "bogus" in r.stderr and "sink" in r.stderr
    r = _suite("--T", "1k")
    assert r.returncode == 2 and "'1k'" in r.stderr
    r = _suite("--sections", "sink", "--T", "1024")
    assert r.returncode == 2 and "needs a CUDA device" in r.stderr
