"""Notes on stderr, silent when quiet; results go to stdout (``probe.present.files``). Progress bars are
``probe.progress``. Ground floor: the verbs, the jobs and the recipes all note through it."""

from __future__ import annotations

import os
import sys
import warnings
from contextvars import ContextVar

from tqdm import tqdm

from probe.progress import progress_bar

# the command line's --quiet around a verb's whole run (set by probe.cli.main): code that holds no Console (the
# run-folder lock, a resume check, a conversion note) notes through note() below and is silent under it too
QUIET: ContextVar[bool] = ContextVar("QUIET", default=False)


def note(line: str) -> None:
    """A line on stderr from code that holds no Console; nothing under --quiet (only the error line is left)."""
    if not QUIET.get():
        tqdm.write(line, file=sys.stderr)


class Console:
    """Notes (stderr) and progress bars, silent with --quiet."""

    def __init__(self, quiet: bool = False):
        self.quiet = quiet
        if quiet:  # libraries' own warnings and bars would break the promise of a silent run
            warnings.simplefilter("ignore")
            os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
            os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

    def note(self, msg: str) -> None:
        """A line on stderr that does not collide with an active progress bar."""
        if not self.quiet:
            tqdm.write(msg, file=sys.stderr)

    def bar(self, total: int, desc: str, unit: str = "it", leave: bool = True):
        """Progress on stderr (``progress_bar``); ``leave=False`` bars (loading stages) erase themselves when closed,
        so an error that follows them is the only line left on the terminal."""
        return progress_bar(total, desc, unit=unit, enabled=not self.quiet, leave=leave)
