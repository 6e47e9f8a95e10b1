"""Each public analysis, run on a tiny model, returns exactly the tables and columns its docstring lists under
``Tables (columns):`` (the API reference shows that list; ``<...>`` in a name stands for a part that depends on the
data: ``block<i>``, ``dormant_rate[<domain>]``). A column added, renamed or dropped without the docstring fails here.

The analyses are found, not listed: every public function of probe/analyses/ whose docstring has that list (read from
the source, as the command finds its verbs). Each runs on a plain tiny custom model with the windows alone, unless
``RUNS`` says what else it needs (a mechanism, an argument)."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

from tests.support.analyses import tiny, windows

ANALYSES = Path(__file__).resolve().parents[2] / "probe" / "analyses"
TABLES = "Tables (columns):"


def public_analyses(folder: Path = ANALYSES) -> dict[str, str]:
    """{"module.function": docstring} of the module-level public functions in ``folder`` that document their tables."""
    found = {}
    for path in sorted(folder.glob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            doc = ast.get_docstring(node) if isinstance(node, ast.FunctionDef) else None
            if doc and TABLES in doc and not node.name.startswith("_"):
                found[f"{path.stem}.{node.name}"] = doc
    return found


def _runs():
    w = windows(2, 2, 12)

    def sweep(model, data):
        return importlib.import_module("probe.analyses.context_sweep").sink_context_sweep(
            model, {8: windows(2, 2, 8), 12: data}
        )[0]

    return w, {
        "sinks.sink_stats": lambda f: f(tiny("sinklogit"), w),
        "sink_heads.sink_heads": lambda f: f(tiny("sinklogit"), w),
        "gates.gate_stats": lambda f: f(tiny("normgate"), w),
        "sources.effective_sources": lambda f: f(tiny("attnres-block4"), w),
        "sources.dense_weights": lambda f: f(tiny("mudd"), w),
        "streams.stream_sources": lambda f: f(tiny("mhc"), w),
        "inject.inject": lambda f: f(tiny("sink+proj"), w, doses=[0.4]),
        "inject.exposure_stats": lambda f: f(tiny("sink+proj"), w),
        "ablate.ablate": lambda f: f(tiny("sinklogit"), w),
        "context_sweep.sink_context_sweep": lambda f: sweep(tiny("sinklogit"), w),
        "backcopy.backcopy_split": lambda f: f(tiny("baseline"), w, triggers=[1, 2, 3]),
        "collapse.collapse": lambda f: f(tiny("baseline"), [2, 4], 5, 7),
    }


WINDOWS, RUNS = _runs()
PUBLIC = public_analyses()


def run(name: str, f):
    """``f`` run as ``RUNS`` says, else on a plain tiny model and the windows."""
    return RUNS[name](f) if name in RUNS else f(tiny("baseline"), WINDOWS)


def test_the_analyses_are_found_and_every_run_names_one():
    assert {"sinks.sink_stats", "massive.massive_activations", "dormant.dormant_heads"} <= set(PUBLIC)
    assert set(RUNS) <= set(PUBLIC), f"RUNS names no documented analysis: {sorted(set(RUNS) - set(PUBLIC))}"


def documented_tables(doc: str) -> dict[str, list[str]]:
    """{table: [column, ...]} from a docstring's 'Tables (columns):' list: ``- ``name``: col, col,`` items, their
    continuation lines indented by two spaces."""
    lines = inspect.cleandoc(doc).splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.strip() == "Tables (columns):"), None)
    assert start is not None, "no 'Tables (columns):' list"
    tables, name = {}, None
    for ln in lines[start + 2 :]:
        m = re.match(r"^- ``(\w+)``: (.*)$", ln)
        if m:
            name, text = m.group(1), m.group(2)
            tables[name] = []
        elif name is not None and ln.startswith("  ") and ln.strip():
            text = ln
        else:
            break
        tables[name] += [c.strip().strip("`") for c in text.split(",") if c.strip()]
    return tables


def _matches(documented: str, column: str) -> bool:
    pattern = "".join(".+" if part.startswith("<") else re.escape(part) for part in re.split(r"(<[^>]+>)", documented))
    return re.fullmatch(pattern, column) is not None


def test_the_docstring_parser_reads_wrapped_blocks():
    doc = """Stats.

    Tables (columns):

    - ``summary``: model, a,
      b
    - ``layers``: layer, ``block<i>``
    """
    assert documented_tables(doc) == {"summary": ["model", "a", "b"], "layers": ["layer", "block<i>"]}
    assert _matches("block<i>", "block12") and not _matches("block<i>", "embed")


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_returned_columns_equal_the_docstring(name, one_thread):
    module, fn = name.split(".")
    f = getattr(importlib.import_module(f"probe.analyses.{module}"), fn)
    want = documented_tables(f.__doc__ or "")
    got = {t: list(df.columns) for t, df in run(name, f).items() if t != "meta" and hasattr(df, "columns")}
    assert sorted(got) == sorted(want), f"{name}: tables {sorted(got)} != documented {sorted(want)}"
    for table, columns in got.items():
        documented = want[table]
        unmatched = [c for c in columns if not any(_matches(d, c) for d in documented)]
        not_returned = [d for d in documented if not any(_matches(d, c) for c in columns)]
        assert not unmatched and not not_returned, (
            f"{name} {table}: returned but not documented {unmatched}; documented but not returned {not_returned}"
        )
