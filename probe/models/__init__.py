"""Instrumented custom transformers: one file per mechanism (attention.py with the value gates of gates.py,
depth.py, dense.py), composed by ProbeForCausalLM from a ProbeConfig; variants.py names mechanism settings and
catalogue.py lists the names (variants, tiers) as plain data.

The names below are imported on first use, so ``from probe.models import VARIANTS, TIERS`` costs no torch or
transformers (``probe models`` answers at once). model.py registers the "probe" model type with transformers' Auto
classes, and ``import probe`` imports it as soon as transformers loads, so after ``import probe.models``,
`AutoModelForCausalLM.from_pretrained(dir)` loads saved probe models.
"""
from __future__ import annotations

import importlib

# name -> the submodule that defines it
_EXPORTS = {"VARIANTS": "catalogue", "TIERS": "catalogue", "TIER_DESCRIPTIONS": "catalogue",
            "ProbeConfig": "config", "ProbeForCausalLM": "model", "GATES": "gates", "ValueGate": "gates",
            "register_gate": "gates", "create": "variants", "config_for": "variants", "added_parameters": "variants",
            "add_variant": "variants"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"probe.models.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'probe.models' has no attribute {name!r}")
