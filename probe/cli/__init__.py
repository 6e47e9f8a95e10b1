"""The ``probe`` command (``main``): the verb table and the parser in ``main``, one module per verb that owns its flags
and its run function, the shared flag groups in ``flags``."""

from probe.cli.main import build_parser, main

__all__ = ["main", "build_parser"]
