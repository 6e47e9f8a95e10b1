"""The ``probe`` command (``main``): flags in ``parser``, the verb table in ``main``, one module per verb family."""
from probe.cli.main import main
from probe.cli.parser import build_parser

__all__ = ["main", "build_parser"]
