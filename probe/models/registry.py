"""How a mechanism is found by name: each kind (value gates, output gates, depth reads, dense mixes) keeps a table of
its classes, and ``registrar`` makes that kind's class decorator, so ``@register_gate("mine")`` on a class is all a new
one needs for ``ProbeConfig(value_gate="mine")`` to build it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T", bound=type)


def registrar(table: dict[str, T], field: str) -> Callable[[str], Callable[[T], T]]:
    """The class decorator that puts a class into ``table`` under a name, the value of config field ``field``."""

    def register(name: str) -> Callable[[T], T]:
        def add(cls: T) -> T:
            table[name] = cls
            return cls

        return add

    register.__doc__ = f'Class decorator: ``@register("mine")`` makes ``ProbeConfig({field}="mine")`` build that class.'
    return register
