"""The shipped coverage table (probe/checkpoints/architectures.json) is read only when a function needs it: damaged,
it is one line naming the file and saying to reinstall probe-attn, and verbs that do not need it (probe's own
models, the model list) run as before."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import probe
from probe.checkpoints import architectures
from tests.support.cli import assert_one_line_error
from tests.support.verbs import WINDOWS, save_tiny

ZOO = Path(probe.__file__).parent / "zoo" / "tiny-baseline"
DAMAGED = {
    "truncated": '{"transformers": "5", "types": {"llama": {"sta',
    "not an object": "[1, 2]",
    "no types": '{"transformers": "5", "counts": {}}',
    "a record without status": '{"types": {"llama": {"adapter": "llama"}}}',
    "a refused type without reason": '{"types": {"llama": {"status": "refused"}}}',
    "not UTF-8": b"\xff\xfe{".decode("latin-1"),
}


@pytest.fixture
def damaged(tmp_path, monkeypatch, request):
    path = tmp_path / "architectures.json"
    text = DAMAGED[request.param]
    path.write_bytes(text.encode("latin-1") if request.param == "not UTF-8" else text.encode())
    monkeypatch.setattr(architectures, "TABLE_FILE", path)
    architectures.table.cache_clear()
    yield path
    architectures.table.cache_clear()


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return save_tiny("llama", tmp_path_factory.mktemp("llama") / "m")


def cli(capsys, *args) -> subprocess.CompletedProcess:
    from probe.cli.main import main

    capsys.readouterr()  # what saving the folder printed
    code = main(list(map(str, args)))
    return subprocess.CompletedProcess([], code, *capsys.readouterr())


@pytest.mark.parametrize("damaged", list(DAMAGED), indirect=True)
def test_a_damaged_table_is_one_line_where_it_is_needed(tmp_path, damaged, llama, capsys):
    r = cli(capsys, "models", "--architectures")
    assert_one_line_error(r, str(damaged), "is damaged", "reinstall probe-attn")
    r = cli(capsys, "sinks", "--model", llama, *WINDOWS, "--out", tmp_path / "out", "--quiet")
    assert_one_line_error(r, str(damaged), "reinstall probe-attn")


@pytest.mark.parametrize("damaged", ["truncated"], indirect=True)
def test_a_damaged_table_stops_nothing_that_does_not_need_it(tmp_path, damaged, capsys):
    architectures.check_architecture("probe", "m")
    architectures.check_architecture(None, "m")
    assert cli(capsys, "models").returncode == 0
    r = cli(capsys, "sinks", "--model", ZOO, *WINDOWS, "--out", tmp_path / "out", "--quiet")
    assert r.returncode == 0, r.stderr


def test_the_shipped_table_is_whole():
    architectures.table.cache_clear()
    assert architectures._table_problem(architectures.table()) is None


def test_importing_the_loader_and_the_cli_never_reads_the_table():
    import sys

    code = (
        "import pathlib\n"
        "read = pathlib.Path.read_text\n"
        "def guarded(self, *a, **k):\n"
        "    assert self.name != 'architectures.json', 'the coverage table was read at import'\n"
        "    return read(self, *a, **k)\n"
        "pathlib.Path.read_text = guarded\n"
        "import probe.checkpoints.architectures, probe.checkpoints.load, probe.cli.main\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
