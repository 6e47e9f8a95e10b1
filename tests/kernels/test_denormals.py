"""probe.kernels.denormals.set_flush_denormal flushes denormal floats on torch's intra-op threads too, where
torch.set_flush_denormal sets the calling thread alone: an elementwise op split across the pool's threads gives 0 on
every element, not only on the caller's share. A behaviour, not a timing (the speed it buys is in the CHANGELOG)."""

from __future__ import annotations

import pytest
import torch

from probe.kernels.denormals import _libgomp, set_flush_denormal

TINY = 1e-39  # below fp32's smallest normal, 1.18e-38
N = 1 << 22


@pytest.fixture
def denormals():
    """N denormal floats, made before any flushing (under FTZ the fill itself would write zeros), on two intra-op
    threads (the worker made now, unflushed, as a run's pool is made before its first flush); flushing is off again
    after the test, on every thread (the suite's conftest puts back one thread)."""
    torch.set_num_threads(2)
    x = torch.full((N,), TINY)
    yield x
    set_flush_denormal(False)


def left(x: torch.Tensor) -> int:
    """How many of x times 1 stay nonzero: the product is split across torch's intra-op threads."""
    return int(torch.count_nonzero(x * 1.0))


@pytest.mark.skipif(_libgomp() is None, reason="torch's intra-op pool is not libgomp here")
def test_every_thread_flushes(denormals):
    assert left(denormals) == N
    torch.set_flush_denormal(True)  # torch's own call: the caller's share flushes, the workers' do not
    assert 0 < left(denormals) < N
    assert set_flush_denormal(True)
    assert left(denormals) == 0
    assert set_flush_denormal(False)
    assert left(denormals) == N


def test_turned_off_denormals_are_kept_on_every_thread(denormals):
    set_flush_denormal(True)
    set_flush_denormal(False)
    assert left(denormals) == N
