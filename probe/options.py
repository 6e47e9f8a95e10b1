"""Command-line options declared once, on a config dataclass: each field is one ``--flag`` (``steps`` ->
``--steps``) whose default is the field's, whose type is the field's metadata ``option(type=...)`` or, without one,
inferred from the default (int and float must be finite and >= 0, an int at most ``MAX_INT``), with tuples as
``nargs="+"`` and booleans as ``--flag / --no-flag``. ``probe train`` builds its training-loop flags from
``probe.train.TrainConfig`` this way and ``probe experiment NAME`` builds every option of a recipe from its config
dataclass.

Also the argparse types whose errors are one line (``expected a positive integer, got '0'``). Only stdlib here, so a
parser built from these costs no heavy import."""

from __future__ import annotations

import argparse
import dataclasses
import math
import typing

MAX_INT = 2**31 - 1  # every count, size and seed of a flag: beyond it a tensor shape, thread count or seed overflows


def _number(cast, valid, message):
    """An argparse type: ``cast(text)`` that must satisfy ``valid``, else one line ``message, got 'text'``; an integer
    above ``MAX_INT`` is refused where it is parsed, before it reaches a tensor shape or a library's C int."""

    def parse(text: str):
        try:
            value = cast(text)
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"{message}, got {text!r}") from None
        if not valid(value):
            raise argparse.ArgumentTypeError(f"{message}, got {text!r}")
        if cast is int and value > MAX_INT:
            raise argparse.ArgumentTypeError(f"expected an integer at most {MAX_INT}, got {text!r}")
        return value

    return parse


positive_int = _number(int, lambda v: v >= 1, "expected a positive integer")


def size_at_most(bound: int, what: str):
    """A positive integer at most ``bound``: a size a model can have (``probe.checkpoints.sizes.BOUNDS``), so a cost
    or shape computed from it stays within memory."""
    return _number(int, lambda v: 1 <= v <= bound, f"expected {what} 1..{bound}")


nonneg_int = _number(int, lambda v: v >= 0, "expected an integer >= 0")
dose = _number(float, lambda v: math.isfinite(v) and v >= 0, "dose must be a finite number >= 0")
positive_float = _number(float, lambda v: math.isfinite(v) and v > 0, "expected a positive number")
nonneg_float = _number(float, lambda v: math.isfinite(v) and v >= 0, "expected a finite number >= 0")
fraction = _number(float, lambda v: 0 <= v <= 1, "expected a number in [0, 1]")
attention_share = _number(float, lambda v: 0 <= v < 1, "expected a share of attention mass, 0 <= eps < 1")
MAX_THREADS = 1024  # torch asks OpenMP for per-thread state up front: 2^31 threads is an abort, not an error
threads = _number(int, lambda v: 1 <= v <= MAX_THREADS, f"expected a thread count 1..{MAX_THREADS}")


def option(help: str, type=None, choices=None) -> dict:  # noqa: A002 - argparse's own names
    """A field's metadata for its flag: ``field(default=..., metadata=option("what it is", positive_int))``; ``type``
    None keeps the text as given. The help gets the default appended, so the default is written once (on the
    field)."""
    return {"option": {"help": help, "type": type, "choices": choices}}


def _non_negative(typ):
    """int/float that is finite and >= 0: every numeric option of a recipe is a count, a size, a rate or a seed."""

    def parse(text: str):
        value = typ(text)  # a ValueError becomes argparse's "invalid int value: 'x'"
        if not math.isfinite(value) or value < 0:
            raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
        if typ is int and value > MAX_INT:
            raise argparse.ArgumentTypeError(f"expected an integer at most {MAX_INT}, got {text!r}")
        return value

    parse.__name__ = typ.__name__
    return parse


def _none_or(typ):
    def parse(text: str):
        return None if text.lower() == "none" else typ(text)

    parse.__name__ = typ.__name__
    return parse


def _scalar_type(field: dataclasses.Field):
    """int/float/str for a field, from its default or (for None defaults) from its annotation text."""
    default = field.default if field.default is not dataclasses.MISSING else None
    if isinstance(default, tuple):
        typ = type(default[0]) if default else str
    else:
        typ = type(default) if default is not None else None
    if typ in (int, float):
        return _non_negative(typ)
    if typ is not None:
        return typ
    text = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", "str")
    for name, typ in (("int", int), ("float", float)):
        if name in text.split(" | ") or name in typing.get_args(field.type):
            return _non_negative(typ)
    return str


def add_options(parser, config_class, names=None, *, underscore_aliases: bool = False) -> None:
    """One flag per field of ``config_class`` (those in ``names``, in that order; default all), as the module
    docstring says. ``underscore_aliases``: also accept ``--min_lr_ratio`` beside ``--min-lr-ratio``."""
    fields = {f.name: f for f in dataclasses.fields(config_class)}
    for name in names or fields:
        f = fields[name]
        flags = [f"--{f.name.replace('_', '-')}"] + ([f"--{f.name}"] if underscore_aliases and "_" in f.name else [])
        default, declared = f.default, f.metadata.get("option", {})
        help_ = f"{declared['help']} (default {default})" if declared else f"default: {default!r}"
        if isinstance(default, bool) or f.type == "bool | None":  # None: --flag / --no-flag / neither
            parser.add_argument(*flags, dest=f.name, action=argparse.BooleanOptionalAction, default=default, help=help_)
        elif declared:  # the declared type (None: the text as given) and choices
            parser.add_argument(
                *flags,
                dest=f.name,
                nargs="+" if isinstance(default, tuple) else None,
                type=declared["type"],
                choices=declared["choices"],
                default=default,
                help=help_,
            )
        elif isinstance(default, tuple):
            parser.add_argument(*flags, dest=f.name, nargs="+", type=_scalar_type(f), default=default, help=help_)
        else:
            typ = threads if f.name == "threads" else _scalar_type(f)  # a recipe's torch threads: bounded as --threads
            parser.add_argument(
                *flags, dest=f.name, type=_none_or(typ) if default is None else typ, default=default, help=help_
            )
