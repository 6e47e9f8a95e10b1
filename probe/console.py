"""Notes on stderr, silent when quiet; results go to stdout (``probe.present.files``). Progress bars are
``probe.progress``. Ground floor: the verbs, the jobs and the recipes all note through it."""

from __future__ import annotations

import os
import sys
import warnings

from tqdm import tqdm

from probe.progress import progress_bar


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
