"""The finished batches of one interrupted analysis in its ``--out`` folder, so that the same command run again
resumes it instead of starting over (``probe inject --out DIR``).

The folder::

    DIR/.partial/<analysis>/settings.json        what determines the numbers (model and its fingerprint, windows,
                                                 the analysis's settings): a rerun with other settings is refused
    DIR/.partial/<analysis>/batch-00003.json     one record per finished batch: its own contribution to the totals
                                                 (floats as JSON numbers, which round-trip float64 exactly)

Each file is staged under a temporary name and renamed into place (``probe.writes.write_files``), so a batch counts
as finished only once its record is whole; the settings come before the first record. The folder is removed when the
analysis has finished and its results are written. One process only: a data-parallel run keeps no partial state.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from probe.errors import UsageError
from probe.jobs.store import settings_diff
from probe.writes import json_safe, remove_empty_dirs, write_files

PARTIAL = ".partial"
SETTINGS = "settings.json"
_BATCH = re.compile(r"batch-(\d+)\.json")


def _plain(settings: dict) -> dict:
    """``settings`` as JSON reads them back (tuples as lists, NaN as null), so a comparison is of like with like."""
    return json.loads(json.dumps(json_safe(settings)))


class BatchState:
    """The finished batches of ``analysis`` in ``out / .partial / analysis``, computed with ``settings``.

    Opening it compares ``settings`` with the ones a finished batch recorded: a difference is a one-line
    ``UsageError`` naming it (resume with the same flags, or remove the folder). ``open(more)`` adds the settings the
    analysis itself derives, and checks them the same way."""

    def __init__(self, out, analysis: str, settings: dict, *, flag: str = "--out"):
        self.out, self.analysis, self.flag = Path(out), analysis, flag
        self.folder = self.out / PARTIAL / analysis
        self.settings = self.given = _plain(settings)
        self.total: int | None = None  # batches of the whole run, once the analysis knows them
        self.settings_written = (self.folder / SETTINGS).is_file()
        self._check()

    def _rel(self, name: str) -> str:
        return str((self.folder / name).relative_to(self.out))

    def _read(self, path: Path):
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            raise UsageError(
                f"{path} is corrupt ({type(e).__name__}: {str(e).splitlines()[0]}); delete it to recompute that "
                f"batch (or delete {self.folder} to start over)"
            ) from None

    def _check(self) -> None:
        path = self.folder / SETTINGS
        if not path.is_file():
            if self.done():  # batches whose settings are unknown cannot be trusted to match
                raise UsageError(
                    f"{self.folder} holds batch records but no {SETTINGS}; delete {self.folder} to start over"
                )
            return
        old = self._read(path)
        if not isinstance(old, dict):
            raise UsageError(f"{path} is corrupt (not a JSON object); delete {self.folder} to start over")
        diff = settings_diff(old, self.settings)
        if diff:
            raise UsageError(
                f"{self.flag} {str(self.out)!r} holds {len(self.done())} finished batch(es) of an interrupted "
                f"`probe {self.analysis}` with other settings ({'; '.join(diff)}); rerun with the same flags to "
                f"resume, or delete {self.folder} (or use another {self.flag}) to start over"
            )

    def open(self, more: dict, total: int) -> None:
        """Add the settings the analysis derives (checked as the others; a name the caller's settings use too is a
        ValueError: the two would shadow each other), and the run's number of batches."""
        more = _plain(more)
        if clash := sorted(set(more) & set(self.given)):
            raise ValueError(f"settings {', '.join(clash)} are the analysis's own; leave them out of BatchState's")
        self.settings = {**self.given, **more}
        self.total = total
        self._check()

    def done(self) -> list[int]:
        """The finished batches, ascending."""
        if not self.folder.is_dir():
            return []
        return sorted(int(m.group(1)) for p in self.folder.iterdir() if (m := _BATCH.fullmatch(p.name)))

    def _batch_name(self, n: int) -> str:
        return f"batch-{n:05d}.json"

    def load(self, n: int) -> dict:
        record = self._read(self.folder / self._batch_name(n))
        if not isinstance(record, dict) or record.get("batch") != n:
            raise UsageError(
                f"{self.folder / self._batch_name(n)} is not the record of batch {n}; delete it to recompute it"
            )
        return record

    def save(self, n: int, record: dict) -> None:
        """Store batch ``n``'s record (the settings first, once): written whole or not at all."""
        files = {} if self.settings_written else {self._rel(SETTINGS): json.dumps(self.settings, indent=1)}
        files[self._rel(self._batch_name(n))] = json.dumps({"batch": n, **record}, allow_nan=True)
        self.folder.mkdir(parents=True, exist_ok=True)
        write_files(self.out, files)
        self.settings_written = True

    def remove(self) -> None:
        """The run finished and its results are written: its partial state goes."""
        shutil.rmtree(self.folder, ignore_errors=True)
        remove_empty_dirs([self.out / PARTIAL])


__all__ = ["BatchState", "PARTIAL"]
