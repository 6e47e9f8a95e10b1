"""The verbs are what the modules of probe/cli/ declare (``VERB``, ``HELP``, ``RANK``), read from their source
(probe.declared): `probe --help` lists them all without importing one, `probe VERB ...` imports that verb's module
alone, and the listing is the one the verbs' own parsers give."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
import textwrap

import pytest

from probe.declared import declaring, literals
from tests.support.cli import ENV

cli = importlib.import_module("probe.cli.main")  # the module (probe.cli re-exports its main function as `main`)
HEAVY = ("torch", "transformers", "pandas", "plotly", "transformer_lens")


def _imported_by(argv: list[str]) -> tuple[list[str], list[str]]:
    """(verb modules, heavy libraries) that ``probe ARGV`` imported, in a fresh interpreter."""
    code = (
        "import contextlib, io, sys\nfrom probe.cli.main import VERBS, main\n"
        f"with contextlib.redirect_stdout(io.StringIO()):\n    try:\n        main({argv!r})\n"
        "    except SystemExit:\n        pass\n"
        "print(sorted(v.module for v in VERBS.values() if v.module in sys.modules))\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV)
    assert r.returncode == 0, r.stderr
    verbs, heavy = r.stdout.strip().splitlines()
    return eval(verbs), eval(heavy)  # two printed lists of names


def test_help_imports_no_verb_module_and_a_verb_only_its_own():
    assert _imported_by(["--help"]) == ([], [])
    assert _imported_by(["inject", "--help"]) == (["probe.cli.inject"], [])
    assert _imported_by(["nosuch"]) == ([], [])


def _listing(parser) -> list[tuple[str, str]]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return [(a.dest, a.help) for a in sub._choices_actions]


def test_the_listing_from_source_is_the_one_the_verbs_parsers_give():
    full, listed = cli.build_parser(), cli.build_parser([])
    assert _listing(listed) == _listing(full)
    assert listed.format_help() == full.format_help()
    assert [name for name, _ in _listing(full)] == list(cli.VERBS)


def test_every_verb_declares_a_literal_help_line_and_its_own_name():
    for name, verb in cli.VERBS.items():
        module = verb.load()
        assert verb.help is not None and verb.help == module.HELP, name  # so --help need not import it
        assert module.VERB == name and callable(module.add_parser) and callable(module.run), name
    assert list(cli.VERBS)[:3] == ["models", "inject", "ablate"] and list(cli.VERBS)[-1] == "doctor"  # by RANK


def test_discovery_reads_the_declarations_and_refuses_a_verb_declared_twice(tmp_path):
    files = {
        "b.py": 'VERB = "bee"\nRANK = 2\nHELP = (\n    "two "\n    "lines"\n)\n',
        "a.py": 'VERB = "ay"\nRANK = 1\nHELP = "one"\n',
        "c.py": 'VERB = "sea"\nHELP = TEXT  # not a literal: listing it imports the module\n',
        "shared.py": '"""Flags, no verb."""\ndef f():\n    VERB = "inner"\n',
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    verbs = cli.discover_verbs(tmp_path, "pkg")
    assert list(verbs) == ["ay", "bee", "sea"]  # by RANK, the verb without one last
    assert verbs["bee"] == cli.Verb("bee", "pkg.b", "two lines", 2) and verbs["sea"].help is None
    (tmp_path / "d.py").write_text('VERB = "ay"\n')
    with pytest.raises(RuntimeError, match="'ay' declared by both pkg.a and pkg.d"):
        cli.discover_verbs(tmp_path, "pkg")


def test_literals_reads_module_level_assignments_as_an_import_would(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(
        textwrap.dedent(
            '''
            """Doc.

            X = "in the docstring, indented: not a statement"
            """
            A: dict[str, str] = {
                "k": "v",  # a comment
            }
            B = 1
            B = 2
            C = some_function()
            D = "x" if True else "y"
            E == 3


            def f():
                F = "local"
            '''
        )
    )
    assert literals(path, ["A", "B", "C", "D", "E", "F", "X"]) == {"A": {"k": "v"}, "B": 2}
    assert declaring(tmp_path, "C") == [path] and declaring(tmp_path, "F") == []


def test_a_verb_with_an_out_folder_has_wait_and_one_reading_data_has_skip_bad_records():
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, p in sub.choices.items():
        flags = {o for a in p._actions for o in a.option_strings}
        assert ("--wait" in flags) == ("--out" in flags), name
        assert ("--skip-bad-records" in flags) == ("--data" in flags), name
