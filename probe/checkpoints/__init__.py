"""Checkpoints by name: ``load`` (name → model), the HF family adapters and ``wrap`` (interop).

``probe.load`` is :func:`probe.checkpoints.load.load` (the module ``load`` keeps its name here). The submodules pull in
transformers / TransformerLens, so they are imported on first use of a name here.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "resolve": "load",
    "ModelNotFoundError": "load",
    "KNOWN_CHECKPOINTS": "load",
    "list_models": "load",
    "wrap": "interop",
    "adapt": "adapters",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"probe.checkpoints.{_EXPORTS[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'probe.checkpoints' has no attribute {name!r}")
