"""The ``probe`` command (``main``): the parser in ``main``, built from the verbs that the modules here declare
(``VERB = "name"``), one module per verb that owns its flags and its run function, the shared flag groups in
``flags``."""

from probe.cli.main import build_parser, main

__all__ = ["main", "build_parser"]
