"""Where the kernel tests run the Triton kernels: on CUDA, or on CPU tensors under Triton's interpreter.

The interpreter works only if TRITON_INTERPRET=1 is set before triton is first imported: tests/conftest.py sets it
for the session, and this module sets it when it is imported first (a test file run on its own). When triton was
imported without it anyway (importing torch._dynamo imports triton), the ``backend="triton"`` cases of a file are
skipped in this process, and that file's ``test_triton_in_fresh_process`` reruns them in a fresh one
(``rerun_in_fresh_process``), so they never go unrun. Every Triton case has "triton" in its test id.
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA and "triton" not in sys.modules:
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the first import of triton
DEV = "cuda" if CUDA else "cpu"
ROOT = Path(__file__).resolve().parents[2]
HAS_TRITON = importlib.util.find_spec("triton") is not None


def _interpreted() -> bool:
    from probe.kernels.sink_attention import triton as sink_triton

    return type(sink_triton._fwd_kernel).__name__ == "InterpretedFunction"


READY = HAS_TRITON and (CUDA or _interpreted())  # Triton kernels can run in this process
FRESH_PROCESS = HAS_TRITON and not READY  # triton was imported without the interpreter: rerun elsewhere

needs_triton = pytest.mark.skipif(
    not READY,
    reason="no triton" if not HAS_TRITON else "triton imported before TRITON_INTERPRET=1: rerun in a fresh process",
)
TRITON = pytest.param("triton", marks=needs_triton)  # the Triton backend as a parameter of a backend comparison


def case(backend: str, *values):
    """One parameter set (backend, *values) of a backend comparison; a Triton one skips where Triton cannot run."""
    return pytest.param(backend, *values, marks=needs_triton if backend == "triton" else ())


def rerun_in_fresh_process(request, path) -> None:
    """Run the Triton cases ("-k triton") of the test file ``path`` in a fresh Python process with the interpreter
    on; they must pass, and something must have run."""
    markexpr = request.config.getoption("markexpr")
    cmd = [sys.executable, "-m", "pytest", "-o", "addopts=", "-q", "-p", "no:cacheprovider", str(path), "-k", "triton"]
    env = dict(
        os.environ,
        TRITON_INTERPRET="1",
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    )
    res = subprocess.run(
        cmd + (["-m", markexpr] if markexpr else []), cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600
    )
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-3000:]
    assert " passed" in res.stdout.strip().splitlines()[-1], res.stdout[-2000:]


def leaf(g: torch.Generator, *shape) -> torch.Tensor:
    """A standard-normal leaf on DEV that records gradients."""
    return torch.randn(*shape, generator=g).to(DEV).requires_grad_()
