"""Session set-up shared by all tests.

Triton runs kernels on CPU tensors only under its interpreter, and TRITON_INTERPRET must be set before triton is
first imported (importing torch._dynamo imports it), so it is set here, before any test module loads.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# tests use tiny tensors: one thread avoids oversubscription overhead (and makes timings steadier)
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors run fastest (and least disturbed by other processes) on one thread."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def pattern_requests(monkeypatch):
    """A list recording, for each attention call of a probe model, whether it asked for the T x T pattern."""
    import probe.models.attention as attention

    asked, real = [], attention.sink_attention

    def spy(*args, **kwargs):
        asked.append(bool(kwargs.get("return_pattern")))
        return real(*args, **kwargs)

    monkeypatch.setattr(attention, "sink_attention", spy)
    return asked


@pytest.fixture(scope="module")
def fx(tmp_path_factory):
    """Saved tiny models, a small text file and two unreadable checkpoints, built once per test module."""
    from tests.support.cli import build_fixtures

    return build_fixtures(tmp_path_factory.mktemp("cli_fixtures"))


def pytest_collection_modifyitems(config, items):
    """Tests marked ``slow`` (large grids: every Triton flag x dtype compiled for every GPU arch, the interpreter's
    big kernel grids) run only when asked for with ``-m slow``; the default run, CI's, skips them."""
    if "slow" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="large grid: run with -m slow")
    for item in items:
        if item.get_closest_marker("slow"):
            item.add_marker(skip)
