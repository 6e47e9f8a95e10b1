"""Depth mechanisms, one module each (docs/how-to/adding-a-mechanism.md#a-depth-mechanism): a module here registers its
read sites (`@register_depth`, probe/models/depth.py) or dense mixes (`@register_dense`, probe/models/dense.py) when
it is imported, and importing this package (probe.models does) imports every module in it."""

from importlib import import_module
from pkgutil import iter_modules

for _module in iter_modules(__path__):
    import_module(f"{__name__}.{_module.name}")
