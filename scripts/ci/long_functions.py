"""Lists the functions and methods in probe/ longer than 80 lines, counted from the `def` line to the last line of
the body (ast's lineno / end_lineno; decorators are not counted). Triton kernels are left out: the files
`probe/kernels/**/triton*.py` and any function decorated with `triton.jit`, whose bodies are one launch's arithmetic
and read best unsplit.

    python scripts/ci/long_functions.py            # one line an offender, longest first; exit 1 when there is one
    python scripts/ci/long_functions.py --limit 60 # another limit
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 80


@dataclass(frozen=True)
class LongFunction:
    """One function over the limit: where it stands and how many lines it spans."""

    path: str
    qualname: str
    line: int
    lines: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line} {self.qualname} ({self.lines} lines)"


def is_triton_file(path: Path) -> bool:
    """A file of Triton kernels: `probe/kernels/<op>/triton*.py`."""
    return "kernels" in path.parts and path.name.startswith("triton")


def is_triton_jit(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether a decorator of the function is `triton.jit` (bare or called with arguments)."""
    for decorator in function.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if isinstance(target, ast.Attribute) and target.attr == "jit" and ast.unparse(target.value) == "triton":
            return True
    return False


def functions(tree: ast.AST, prefix: str = "") -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function and method below a node, with its dotted name (Class.method, outer.inner)."""
    found = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found.append((prefix + node.name, node))
            found.extend(functions(node, f"{prefix}{node.name}."))
        elif isinstance(node, ast.ClassDef):
            found.extend(functions(node, f"{prefix}{node.name}."))
        else:
            found.extend(functions(node, prefix))
    return found


def long_functions_in(source: str, path: str, limit: int = LIMIT) -> list[LongFunction]:
    """The functions of one file's source longer than limit lines (Triton-JIT kernels left out)."""
    found = []
    for qualname, function in functions(ast.parse(source, filename=path)):
        # end_lineno is set on every node ast.parse returns; lineno is the `def` line, after the decorators
        lines = (function.end_lineno or function.lineno) - function.lineno + 1
        if lines > limit and not is_triton_jit(function):
            found.append(LongFunction(path, qualname, function.lineno, lines))
    return found


def long_functions(root: Path = ROOT, limit: int = LIMIT) -> list[LongFunction]:
    """The functions in root/probe longer than limit lines, outside the Triton files, longest first."""
    found = []
    for path in sorted((root / "probe").rglob("*.py")):
        relative = path.relative_to(root)
        if not is_triton_file(relative):
            found += long_functions_in(path.read_text(encoding="utf-8"), relative.as_posix(), limit)
    return sorted(found, key=lambda long: (-long.lines, long.path, long.line))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=LIMIT, help=f"most lines a function may span (default {LIMIT})")
    limit = parser.parse_args(argv).limit
    offenders = long_functions(limit=limit)
    for offender in offenders:
        print(offender)
    print(f"{len(offenders)} function(s) over {limit} lines")
    return 1 if offenders else 0


if __name__ == "__main__":
    sys.exit(main())
