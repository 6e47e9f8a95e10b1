"""The ``probe`` command (``main``); one module per verb family, parsed in ``probe.cli.main``."""
from probe.cli.main import build_parser, main

__all__ = ["main", "build_parser"]
