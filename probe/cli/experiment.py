"""``probe experiment NAME --out DIR [options]``: one of the papers' experiment recipes. The recipes parse their own
options (one config dataclass per recipe, ``probe.experiments.command``); this verb only names them in ``--help``."""

from __future__ import annotations

import argparse

VERB = "experiment"  # this module is `probe experiment` (probe.cli.main finds verbs by this line)
RANK = 90  # its place in `probe --help`
HELP = (
    "run one of the papers' experiment recipes: probe experiment NAME --out DIR (probe experiment --list; NAME "
    "--help lists its options)"
)


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("experiment", help=HELP, description=HELP, allow_abbrev=False)
    p.add_argument("recipe", nargs=argparse.REMAINDER, help="NAME --out DIR [options]")
    return p


def run(argv: list[str]) -> int:
    """``probe experiment ...``: the words after the verb, which ``probe.cli.main`` hands here before its parser sees
    them (each recipe parses its own options)."""
    from importlib import import_module

    return import_module("probe.experiments.command").main(argv, prog="probe experiment")
