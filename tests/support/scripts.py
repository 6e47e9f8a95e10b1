"""The repository's scripts (not a package) as modules, for the tests that call their functions."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load_script(relative: str, name: str):
    """The script at ROOT/``relative`` imported as module ``name`` (registered in sys.modules: a dataclass in it looks
    its module up)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / relative)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
