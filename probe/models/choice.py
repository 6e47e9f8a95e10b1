"""The one-line refusal of a config field whose value is not one of its choices, shared by the option groups of
ProbeConfig (config.py) and those kept beside their registries (gates.py, out_gates.py, depth.py, dense.py)."""

from __future__ import annotations

from collections.abc import Iterable


def check_choice(field: str, value, choices: Iterable) -> None:
    """Raise ``ValueError("field='x' is not valid; choose one of a, b")`` unless ``value`` is one of ``choices``."""
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"{field}={value!r} is not valid; choose one of {', '.join(map(str, choices))}")
