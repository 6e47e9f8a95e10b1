"""Notes and progress bars on stderr, silent when quiet; results go to stdout (see ``probe.output``)."""
from __future__ import annotations

import os
import sys
import warnings

from tqdm import tqdm
from tqdm.auto import tqdm as auto_tqdm


class Console:
    """Notes (stderr) and tqdm bars, silent with --quiet."""

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
        """A tqdm bar on stderr; ``leave=False`` bars (loading stages) erase themselves when closed, so an error
        that follows them is the only line left on the terminal."""
        return auto_tqdm(total=total, desc=desc, unit=unit, disable=self.quiet, file=sys.stderr, dynamic_ncols=True,
                         leave=leave)
