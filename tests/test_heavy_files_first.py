"""The suite's scheduling order (tests/conftest.py): the heaviest files go to pytest-xdist's workers first, each file's
tests stay together and in order, and every listed file exists (a renamed one would silently go back to the end)."""

from pathlib import Path
from types import SimpleNamespace

from tests.conftest import HEAVY_FIRST, heavy_files_first

ROOT = Path(__file__).resolve().parents[1]


def test_every_heavy_file_exists():
    assert [p for p in HEAVY_FIRST if not (ROOT / p).is_file()] == []


def test_heavy_files_go_first_and_each_file_stays_together():
    ids = ["tests/a.py::x", "tests/b.py::x", "tests/b.py::y", HEAVY_FIRST[1] + "::t", "tests/c.py::z"]
    ids += ["tests/a.py::w", HEAVY_FIRST[0] + "::s", HEAVY_FIRST[1] + "::u"]
    order = [item.nodeid for item in heavy_files_first([SimpleNamespace(nodeid=i) for i in ids])]
    assert order == [
        HEAVY_FIRST[0] + "::s",
        HEAVY_FIRST[1] + "::t",
        HEAVY_FIRST[1] + "::u",
        "tests/a.py::x",  # two tests each: collection order among them
        "tests/a.py::w",
        "tests/b.py::x",
        "tests/b.py::y",
        "tests/c.py::z",
    ]
