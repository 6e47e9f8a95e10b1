"""Analyses: pure functions from captured tensors to numbers and DataFrames, each with a plotly figure function.

Submodules load on first use (``probe.analyses.costs``), so importing the package pulls in neither pandas nor plotly.
"""

from __future__ import annotations

import importlib


def __getattr__(name: str):
    if name.startswith("_"):
        raise AttributeError(name)
    try:
        return importlib.import_module(f"probe.analyses.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"probe.analyses.{name}":
            raise
        raise AttributeError(f"module 'probe.analyses' has no attribute {name!r}") from None
