"""The hook namespace (names), model descriptions (info), name → model loading (load) and HF adapters.

``wrap``, ``adapt``, ``resolve`` … are imported lazily (they pull in transformers / TransformerLens). Loading by name
is ``probe.load`` (``probe.hooks.load`` is the module that implements it).
"""
from probe.hooks import names
from probe.hooks.info import ModelInfo

__all__ = ["names", "ModelInfo", "resolve", "wrap", "adapt", "ModelNotFoundError", "KNOWN_CHECKPOINTS", "list_models"]


def __getattr__(name: str):
    if name in {"resolve", "ModelNotFoundError", "KNOWN_CHECKPOINTS", "list_models"}:
        import importlib

        return getattr(importlib.import_module("probe.hooks.load"), name)
    if name == "wrap":
        from probe.hooks.interop import wrap

        globals()["wrap"] = wrap
        return wrap
    if name == "adapt":
        from probe.hooks.adapters import adapt

        return adapt
    raise AttributeError(f"module 'probe.hooks' has no attribute {name!r}")
