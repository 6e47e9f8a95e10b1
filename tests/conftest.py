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


# The files whose tests take longest (seconds summed from --durations of a whole run on 2 cores with 2 workers, an
# AMD EPYC, 2026-12-07), largest first. pytest-xdist's --dist loadfile hands out whole files in collection order
# (pyproject turns off its reordering by test count, which put these few-test files last): started first, they no
# longer leave one worker running alone at the end.
HEAVY_FIRST = (
    "tests/docs/test_pages.py",  # 259 s (the site build, which test_site.py and test_notebooks.py then read)
    "tests/kernels/test_aot_compile.py",  # 189 s
    "tests/cli/test_cli.py",  # 166 s
    "tests/checkpoints/test_gemma.py",  # 163 s
    "tests/experiments/test_kill_boundaries.py",  # 136 s
    "tests/models/test_model_training.py",  # 101 s
    "tests/cli/test_hostile_flags.py",  # 97 s
    "tests/jobs/test_golden.py",  # 95 s
    "tests/train/test_zoo.py",  # 82 s
    "tests/cli/test_verbs_per_family.py",  # 69 s
    "tests/checkpoints/test_architectures.py",  # 67 s
    "tests/checkpoints/test_architectures_more.py",  # 64 s
    "tests/cli/test_verbs_per_family_more.py",  # 64 s
    "tests/cli/test_inject_interrupt.py",  # 57 s
    "tests/kernels/test_sink_attention.py",  # 50 s
    "tests/analyses/test_parallel_analyses.py",  # 45 s
    "tests/analyses/test_gu2025_golden.py",  # 43 s
    "tests/models/test_models.py",  # 41 s
    "tests/present/test_browser.py",  # 39 s
    "tests/jobs/test_report.py",  # 38 s
    "tests/train/test_ddp.py",  # 38 s
)


def heavy_files_first(items: list) -> list:
    """``items`` with each file's tests kept together and in order: the HEAVY_FIRST files first, in that order, then
    the others by number of tests, most first (xdist's own order)."""
    by_file: dict[str, list] = {}
    for item in items:
        by_file.setdefault(item.nodeid.split("::")[0], []).append(item)
    rank = {path: i for i, path in enumerate(HEAVY_FIRST)}
    files = sorted(by_file, key=lambda path: (rank.get(path, len(rank)), -len(by_file[path])))
    return [item for path in files for item in by_file[path]]


def pytest_collection_modifyitems(config, items):
    """The heaviest files first (heavy_files_first). Tests marked ``slow`` (large grids: every Triton flag x dtype
    compiled for every GPU arch, the interpreter's big kernel grids) run only when asked for with ``-m slow``;
    the default run, CI's, skips them."""
    items[:] = heavy_files_first(items)
    if "slow" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="large grid: run with -m slow")
    for item in items:
        if item.get_closest_marker("slow"):
            item.add_marker(skip)
