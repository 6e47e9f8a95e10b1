"""The runtime backend choice (probe.kernels.backend) every op's dispatch reads, and the package without triton."""

import subprocess
import sys

import pytest

from probe.kernels import BACKENDS, sink_attention
from tests.kernels.interpreter import ROOT
from tests.kernels.naive import rand_qkv


def test_use_backend_is_read_when_an_op_runs(monkeypatch):
    from probe.kernels import current_backend, use_backend
    from probe.kernels.sink_attention import dispatch

    assert set(BACKENDS) == {"auto", "torch", "reference", "sdpa", "triton", "compiled"}
    calls = []
    real = dispatch.sink_attention_reference
    monkeypatch.setattr(dispatch, "sink_attention_reference", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.delenv("PROBE_BACKEND", raising=False)
    q, k, v = rand_qkv()
    assert current_backend() == "auto"
    sink_attention(q, k, v)
    assert calls == []
    with use_backend("reference"):
        sink_attention(q, k, v)
        with use_backend("sdpa"):  # the innermost block
            assert current_backend() == "sdpa"
            sink_attention(q, k, v)
        with use_backend(None):  # no choice: the outer one stays
            sink_attention(q, k, v)
        sink_attention(q, k, v, backend="sdpa")  # an explicit argument wins
    assert len(calls) == 2 and current_backend() == "auto"
    monkeypatch.setenv("PROBE_BACKEND", "reference")
    sink_attention(q, k, v)
    assert len(calls) == 3
    with pytest.raises(ValueError, match="auto.*torch.*reference.*sdpa.*triton"):
        with use_backend("cuda"):
            pass


def test_imports_and_runs_without_triton():
    code = """
import sys
sys.modules["triton"] = None  # any import of triton now raises ImportError
import torch
import probe.kernels as K
q, k, v = torch.randn(1, 5, 2, 4), torch.randn(1, 5, 1, 4), torch.randn(1, 5, 1, 4)
K.sink_attention(q, k, v, sink=torch.zeros(2))
K.depth_attention([v[:, :, 0]] * 2, [v[:, :, 0]] * 2, torch.randn(4))
K.attention_row_masses(q, k, v)
assert not K.triton_available()
for op, args in [(K.sink_attention, (q, k, v)), (K.attention_row_masses, (q, k, v)),
                 (K.depth_attention, ([v[:, :, 0]], [v[:, :, 0]], torch.randn(4)))]:
    try:
        op(*args, backend="triton")
    except RuntimeError as e:
        assert "triton" in str(e)
    else:
        raise SystemExit(f"{op.__name__}(backend='triton') without triton should raise")
print("ok")
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=str(ROOT))
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr
