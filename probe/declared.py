"""Module-level constants read from a module's source without importing it: which modules of a package declare a
name, and the literal values they assign it.

The command line finds its verbs this way (each ``probe/cli/<verb>.py`` declares ``VERB``) and lists them in ``probe
--help`` from their ``HELP`` lines, and a folder's index describes its files from the presentation modules'
``DESCRIPTIONS``, so neither imports the modules behind them (nor torch, which an analysis's run imports). Standard
library only.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from pathlib import Path

_NOT_LITERAL = object()


def _assignments(names: Iterable[str]) -> re.Pattern:
    """Assignments of ``names`` at column 0, i.e. at module level: ``NAME = ...`` or ``NAME: type = ...``."""
    alternatives = "|".join(re.escape(n) for n in names)
    return re.compile(rf"^({alternatives})[ \t]*(?::[^=\n]*)?=(?!=)", re.M)


def _in_long_string(text: str, pos: int) -> bool:
    """``pos`` lies inside a triple-quoted string (a docstring's example line is no statement): an odd number of
    quote triples before it."""
    return text.count('"""', 0, pos) % 2 == 1 or text.count("'''", 0, pos) % 2 == 1


def _value(text: str, start: int):
    """The literal assigned by the statement that starts at ``text[start]``: the shortest run of its lines that parses
    (a statement spans lines only inside brackets or strings), else ``_NOT_LITERAL``."""
    end = start
    while end < len(text):
        end = text.find("\n", end + 1)
        end = len(text) if end < 0 else end
        try:
            statement = ast.parse(text[start:end]).body[0]
        except SyntaxError:
            continue
        try:
            return ast.literal_eval(statement.value)
        except ValueError:  # an expression (a name, a call): only importing the module tells
            return _NOT_LITERAL
    return _NOT_LITERAL


def literals(path: Path, names: Iterable[str]) -> dict[str, object]:
    """{name: value} of ``names`` assigned a literal (``ast.literal_eval``) at module level in the Python file
    ``path``, the last assignment winning as on import; a name not assigned there, or assigned an expression, is
    absent."""
    text = Path(path).read_text(encoding="utf-8")
    found = {}
    for m in _assignments(names).finditer(text):
        if not _in_long_string(text, m.start()):
            found[m.group(1)] = _value(text, m.start())
    return {name: value for name, value in found.items() if value is not _NOT_LITERAL}


def declaring(folder: Path, name: str) -> list[Path]:
    """The modules (``*.py`` files) directly in ``folder`` that assign ``name`` at module level, sorted by file name."""
    pattern, found = _assignments([name]), []
    for path in sorted(Path(folder).glob("*.py")):
        text = path.read_text(encoding="utf-8")
        if any(not _in_long_string(text, m.start()) for m in pattern.finditer(text)):
            found.append(path)
    return found


def registered(package: Path, decorator: str) -> tuple[str, ...]:
    """The names classes are registered under by ``@decorator("name")`` in the modules of ``package`` (a folder) that
    its ``__init__.py`` imports, in the order it imports them (the registry's order on import)."""
    package = Path(package)
    init = ast.parse((package / "__init__.py").read_text(encoding="utf-8"))
    modules = [
        node.module.rsplit(".", 1)[-1]
        for node in init.body
        if isinstance(node, ast.ImportFrom)
        and node.module
        and (package / f"{node.module.rsplit('.', 1)[-1]}.py").is_file()
    ]
    names: list[str] = []
    for module in dict.fromkeys(modules):
        tree = ast.parse((package / f"{module}.py").read_text(encoding="utf-8"))
        for node in tree.body:
            for dec in getattr(node, "decorator_list", ()) if isinstance(node, ast.ClassDef) else ():
                call = dec if isinstance(dec, ast.Call) and isinstance(dec.func, ast.Name) else None
                if call is not None and call.func.id == decorator and call.args:
                    arg = call.args[0]
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value not in names:
                        names.append(arg.value)
    return tuple(names)


__all__ = ["literals", "declaring", "registered"]
