"""No function or method in probe/ spans more than 80 lines, from its `def` line to the last line of its body
(decorators not counted), outside the Triton kernels: scripts/ci/long_functions.py lists the offenders. A longer
function is split into named pieces that read top-down."""

from __future__ import annotations

import textwrap
from pathlib import Path

from tests.support.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
long_functions = load_script("scripts/ci/long_functions.py", "long_functions")


def _function(name: str, body_lines: int, decorators: tuple[str, ...] = (), indent: str = "") -> str:
    """A function whose `def` line and body span 1 + body_lines lines."""
    head = [f"{indent}@{d}" for d in decorators] + [f"{indent}def {name}():"]
    return "\n".join(head + [f"{indent}    x{i} = {i}" for i in range(body_lines)]) + "\n"


def test_no_function_in_probe_is_over_the_limit():
    offenders = long_functions.long_functions()
    assert not offenders, "split these into named pieces:\n" + "\n".join(map(str, offenders))


def test_the_count_runs_from_the_def_line_to_the_end_of_the_body():
    source = _function("fits", 79) + _function("over", 80) + _function("far_over", 90)
    found = long_functions.long_functions_in(source, "m.py", limit=80)
    # fits: 80 lines, at the limit; over: 81 lines, starting after fits' 80
    assert [(f.qualname, f.line, f.lines) for f in found] == [("over", 81, 81), ("far_over", 162, 91)]


def test_decorators_do_not_count_and_methods_are_named_by_their_class():
    source = "class Table:\n" + _function("rows", 80, decorators=("property", "cache"), indent="    ")
    (found,) = long_functions.long_functions_in(source, "m.py", limit=80)
    assert (found.qualname, found.line, found.lines) == ("Table.rows", 4, 81)
    assert long_functions.long_functions_in(source, "m.py", limit=81) == []


def test_triton_kernels_are_left_out():
    kernel = _function("kernel", 100, decorators=("triton.jit",)) + _function("tuned", 100, ("triton.jit(debug=1)",))
    assert long_functions.long_functions_in(kernel, "m.py") == []
    other_jit = _function("scripted", 100, decorators=("torch.jit.script",))
    assert [f.qualname for f in long_functions.long_functions_in(other_jit, "m.py")] == ["scripted"]
    assert long_functions.is_triton_file(Path("probe/kernels/sink_attention/triton.py"))
    assert not long_functions.is_triton_file(Path("probe/kernels/sink_attention/dispatch.py"))


def test_nested_functions_are_measured_on_their_own():
    inner = textwrap.indent(_function("inner", 85), "    ")
    found = long_functions.long_functions_in("def outer():\n" + inner, "m.py", limit=80)
    assert [(f.qualname, f.lines) for f in found] == [("outer", 87), ("outer.inner", 86)]
