"""probe: mechanistic interpretability of how attention routes information.

Heavy libraries are imported lazily so that ``import probe`` and ``probe --help`` stay fast.
"""
from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["load", "models", "__version__"]


def __getattr__(name: str):
    if name == "load":
        from probe.hooks.load import load

        return load
    if name in {"models", "kernels", "hooks", "analyses", "data", "train"}:
        import importlib

        return importlib.import_module(f"probe.{name}")
    raise AttributeError(f"module 'probe' has no attribute {name!r}")
