"""Notes on stderr, silent when quiet; results go to stdout (see ``probe.present.files``). Progress bars are
``probe.progress``.
"""

from __future__ import annotations

import math
import os
import sys
import warnings

from tqdm import tqdm

from probe.progress import plural, progress_bar


def number(x: float, digits: int = 4) -> str:
    """A measured value with ``digits`` significant digits (``3.91``, ``0.0213``, ``1.2e+04``)."""
    return f"{x:.{digits}g}"


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


def summary_lines(row: dict, keys) -> str:
    """``  key  value`` lines; a ``<key>_se`` in the row is shown as ``value ± se`` (when there is one: it needs two
    batches), a NaN value (e.g. no token reaches --min-count) as n/a."""
    out = []
    for k in keys:
        if k in row:
            v, se = row[k], row.get(f"{k}_se")
            if isinstance(v, float):
                text = "n/a" if math.isnan(v) else f"{v:.4g}"
                if se is not None and not math.isnan(v) and math.isfinite(se):
                    text += f" ± {se:.2g}"
            else:
                text = str(v)
            out.append(f"  {k:<22} {text}")
    return "\n".join(out)


def plan_line(verb: str, model, eb, passes: int = 1, what: str = "") -> str:
    """The one line a verb notes before its forward passes: model, windows and how many passes."""
    n = eb.tokens.shape[0] * eb.tokens.shape[1]
    extra = f" x {passes} forward passes ({what})" if passes > 1 else ""
    return (
        f"plan: {verb} on {model.probe_info.name} — {plural(eb.tokens.shape[0], 'batch')} x "
        f"{plural(eb.tokens.shape[1], 'window')} x {eb.ctx} tokens ({plural(n, 'window')}, {eb.corpus}, "
        f"{eb.mode}){extra}"
    )
