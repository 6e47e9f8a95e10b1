"""Progress on stderr: a tqdm bar on a terminal; piped to a file or a CI log, plain lines (one at each tenth of the work
and one at the end), never carriage returns or escape codes. Used by the analyses and the trainer, which print nothing
else (notes and results belong to ``probe.present``). ``quiet_hf_bars`` turns transformers' own bars off around work
that takes moments (loading or saving local weights): in a notebook each would be a widget left in the cell, or
tqdm's "IProgress not found" warning where ipywidgets is missing.
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager

from tqdm import tqdm  # tqdm.auto would warn in a notebook without ipywidgets; there progress is plain lines anyway


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 batch``, ``2 batches``, ``1,024 tokens``: a count with its noun in the right number."""
    if n == 1:
        return f"1 {word}"
    return f"{n:,} {many or (word + 'es' if word.endswith(('s', 'x', 'ch', 'sh')) else word + 's')}"


class PlainProgress:
    """tqdm's update / set_description / set_postfix / close as plain lines: one per tenth of ``total`` (at most one
    every ``min_interval`` seconds) and one when closed after some work (a bar closed by an error before any work
    prints nothing, so that error is the only line)."""

    def __init__(self, total: int, desc: str, unit: str = "it", initial: int = 0, file=None, min_interval: float = 2.0):
        self.total, self.desc, self.unit, self.n, self.initial = total, desc, unit, initial, initial
        self.file, self.min_interval, self.postfix = file or sys.stderr, min_interval, ""
        self._next = self._step_after(initial)
        self._last_t = 0.0
        self._closed = False

    def _step_after(self, n: int) -> int:
        tenth = max(1, -(-self.total // 10)) if self.total else 1
        return (n // tenth + 1) * tenth

    def _line(self) -> None:
        count = f"{self.n}/{self.total}" if self.total else str(self.n)
        if self.unit != "it":  # tqdm's default unit says nothing: leave it out
            count = f"{self.n}/{plural(self.total, self.unit)}" if self.total else plural(self.n, self.unit)
        post = f" ({self.postfix})" if self.postfix else ""
        self.file.write(f"{self.desc}: {count}{post}\n")
        self.file.flush()
        self._last_t = time.monotonic()

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.n >= self._next and self.n < (self.total or self.n + 1):
            self._next = self._step_after(self.n)
            if time.monotonic() - self._last_t >= self.min_interval:
                self._line()

    def set_description(self, desc: str, refresh: bool = True) -> None:
        self.desc = desc

    def set_postfix(self, ordered_dict=None, refresh: bool = True, **kwargs) -> None:
        self.postfix = ", ".join(f"{k}={v}" for k, v in {**(ordered_dict or {}), **kwargs}.items())

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self.n > self.initial:
                self._line()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _Silent(PlainProgress):
    def _line(self) -> None:
        pass


def progress_bar(
    total: int, desc: str, *, unit: str = "it", enabled: bool = True, leave: bool = True, initial: int = 0
):
    """A tqdm bar on stderr when it is a terminal, plain lines when it is not, nothing when not ``enabled``.
    ``leave=False`` (loading stages) erases a terminal bar when closed and prints no lines."""
    if not enabled or (not leave and not sys.stderr.isatty()):
        return _Silent(total, desc, unit, initial)
    if not sys.stderr.isatty():
        return PlainProgress(total, desc, unit, initial)
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True, leave=leave, initial=initial)


@contextmanager
def quiet_hf_bars(hub: bool = False):
    """transformers' progress bars ("Loading weights", "Writing model shards") off inside the block, by its own
    switch (``transformers.utils.logging``), and back as they were after it. Hub downloads are huggingface_hub's
    bars and are left alone, unless ``hub`` (the command line's --quiet: no bar of any library)."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    hub_was_off = None
    if hub:
        try:
            from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars

            hub_was_off = are_progress_bars_disabled()
            disable_progress_bars()
        except ImportError:  # pragma: no cover - transformers requires huggingface_hub
            hub_was_off = None
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()
        if hub_was_off is False:
            from huggingface_hub.utils import enable_progress_bars

            enable_progress_bars()
