"""probe: mechanistic interpretability of how attention routes information.

Heavy libraries are imported lazily so that ``import probe`` and ``probe --help`` stay fast. The custom model type
is registered with transformers' Auto classes as soon as transformers is in use (now, or when it is first imported),
so after ``import probe``, ``AutoModelForCausalLM.from_pretrained(dir)`` loads saved probe models.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import sys

__version__ = "0.2.0"

__all__ = ["load", "materialize", "models", "__version__"]


@contextlib.contextmanager
def materialize(model):
    """``with probe.materialize(model):`` every lazy hook point of ``model`` (attention patterns and phantom mass,
    depth weights and routing keys, the stream sums of hyper-connected blocks; value gates always fire) is computed on
    each forward, as if a hook asked for it.

    TransformerLens hooks switch these on by themselves; tools that add none, like ``nnsight.NNsight(model)``, need
    this to read or edit them (otherwise nnsight reports that the model already ran past them). Works on custom probe
    models and adapted HF checkpoints (whose ``materialize_patterns`` property is the same switch)."""
    sites = [m for m in model.modules() if isinstance(getattr(m, "materialize", None), bool)]
    before = [m.materialize for m in sites]
    for m in sites:
        m.materialize = True
    try:
        yield model
    finally:
        for m, was in zip(sites, before):
            m.materialize = was


def __getattr__(name: str):
    if name == "load":
        from probe.checkpoints.load import load

        return load
    # subpackages on first use (``probe.checkpoints.wrap(x)`` after a plain ``import probe``): ``import probe``
    # itself stays free of torch and transformers
    if name in {"models", "kernels", "hooks", "analyses", "data", "train", "checkpoints"}:
        return importlib.import_module(f"probe.{name}")
    raise AttributeError(f"module 'probe' has no attribute {name!r}")


class _RegisterWhenTransformersLoads(importlib.abc.MetaPathFinder):
    """Runs ``import probe.models`` (which registers the "probe" model type) right after transformers loads."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "transformers":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_register(module):
            exec_module(module)  # transformers swaps in its lazy module itself
            importlib.import_module("probe.models")

        spec.loader.exec_module = exec_and_register
        return spec


if "transformers" in sys.modules:
    importlib.import_module("probe.models")
elif not any(isinstance(f, _RegisterWhenTransformersLoads) for f in sys.meta_path):
    sys.meta_path.insert(0, _RegisterWhenTransformersLoads())
