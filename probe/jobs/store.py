"""One resumable many-model run in a folder: where ``probe report`` (and each of its shards, and their merge) and the
pretrained-model recipes keep every finished model's results, so that a run killed at any point and started again
with the same settings recomputes nothing it finished and ends with the numbers an uninterrupted run has.

The folder::

    DIR/manifest.json        {"kind", "settings", "models", ...}: what wrote the run (a recipe's name; no kind: a
                             report), the settings that determine the numbers (checked on resume), the run's model
                             list in order, and what its kind adds (a report's shard, a merge's source folders)
    DIR/models/<slug>.json   one JSON record per finished model, staged under a dot-name and renamed into place
                             (``probe.writes.write_files``): a model counts as done only once renamed (a report
                             over several contexts: one per (model, context), ``probe.jobs.report.ctx_key``)
    DIR/inputs/<slug>.fingerprint  the fingerprints of what that record was computed from (a local model's files,
                             the corpus; docs/definitions.md#resume-fingerprints), written just before the record

Opened on a folder with a manifest, the kind, the settings and the shard must match (a one-line error names what
differs); staged files of a killed run are removed. Another folder must be new or empty. Nothing is written before the
first record, so a run that fails before any model finishes leaves no files; the manifest is (re)written with the
first record of a run and at its end, with the model list of the run that wrote it. Without a folder, records stay in
memory, as JSON too, so a result reads the same whether it was computed now or reloaded.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from probe.console import Console
from probe.console import note as stderr_note
from probe.errors import UsageError
from probe.jobs.fingerprints import describe, outdated
from probe.jobs.lock import LOCK_NAME
from probe.writes import json_safe, remove_stale_temps, write_files

MANIFEST = "manifest.json"
MODELS = "models"
INPUTS = "inputs"
REPORT = "report"  # the kind of a `probe report` folder (its manifest records no kind field)


class RunFolderError(UsageError, ValueError):
    """A folder that cannot hold this run: a one-line usage error on the command line, and a ValueError to the Python
    callers of the recipes (their errors are ValueErrors)."""


def slug(name: str) -> str:
    """A model name as a file name: readable, and distinct for distinct names (a hash of the whole name)."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_")[-60:]
    return f"{safe}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"


def record_path(folder: Path, name: str) -> Path:
    return Path(folder) / MODELS / f"{slug(name)}.json"


def _read_state(path: Path, recover: str) -> dict:
    """A state file of the run folder as JSON; a damaged one (truncated, not JSON, not an object) is one line naming
    it and how to recover."""
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise RunFolderError(f"{path} is corrupt ({type(e).__name__}: {str(e).splitlines()[0]}); {recover}") from None
    if not isinstance(state, dict):
        raise RunFolderError(f"{path} is corrupt (a JSON {type(state).__name__}, not an object); {recover}")
    return state


def fingerprint_path(folder: Path, name: str) -> Path:
    """Where a finished model's input fingerprints are kept (JSON; not a .json: not one of the run's results)."""
    return Path(folder) / INPUTS / f"{slug(name)}.fingerprint"


def read_record(folder: Path, name: str) -> dict:
    return _read_state(record_path(folder, name), f"delete it and run again: model {name!r} is then recomputed")


def read_manifest(folder: Path) -> dict | None:
    """The folder's manifest, or None when it has none or one of another program; a damaged one is a one-line
    RunFolderError."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        return None
    manifest = _read_state(path, "restore it, or delete the folder (or choose another --out) to start the run over")
    return manifest if {"settings", "models"} <= manifest.keys() else None


def shard_name(shard: dict | None) -> str:
    return "the whole" if shard is None else f"shard {shard['index']}/{shard['count']}"


def settings_diff(old: dict, new: dict) -> list[str]:
    return [f"{k}: {old.get(k)!r} (now {v!r})" for k, v in new.items() if old.get(k) != v]


class RunStore:
    """The finished models of one run in ``out`` (None: in memory only).

    ``settings``: what determines the numbers; ``models``: the run's whole model list (recorded in the manifest; the
    models this process computes may be a share of it); ``kind``: what writes the folder; ``shard``: which shard of
    its run the folder holds (None: the whole run); ``extra``: more manifest fields."""

    def __init__(
        self, out, settings: dict, models, *, kind: str = REPORT, shard: dict | None = None, extra: dict | None = None
    ):
        self.out = None if out is None else Path(out)
        self.settings, self.models, self.kind, self.shard = settings, list(models), kind, shard
        self.extra = {**({} if shard is None else {"shard": shard}), **(extra or {})}
        self.memory: dict[str, str] = {}
        self.manifest_written = False
        if self.out is not None:
            self._check()

    def _what(self) -> str:
        return "a report" if self.kind == REPORT else f"the result of {self.kind!r}"

    def _check(self) -> None:
        out = self.out
        old = read_manifest(out)
        if old is not None:
            kind = old.get("kind", REPORT)
            if kind != self.kind:
                raise RunFolderError(
                    f"--out {str(out)!r} holds the result of {kind!r}, not {self.kind!r}; choose another --out"
                )
            diff = settings_diff(old["settings"], self.settings)
            if diff:
                raise RunFolderError(
                    f"--out {str(out)!r} holds {self._what()} computed with other settings "
                    f"({'; '.join(diff)}); use the same flags to resume, or another --out"
                )
            if shard_name(old.get("shard")) != shard_name(self.shard):  # the share follows the model list
                raise RunFolderError(
                    f"--out {str(out)!r} holds {shard_name(old.get('shard'))} of a report, not "
                    f"{shard_name(self.shard)}; resume it with the same --models/--checkpoints and "
                    "--shard, or use another --out"
                )
        elif (out / MANIFEST).exists() or (
            out.exists() and (not out.is_dir() or any(p for p in out.iterdir() if not p.name.startswith(".")))
        ):
            noun = "report" if self.kind == REPORT else f"{self.kind} run"
            raise RunFolderError(
                f"--out {str(out)!r} exists and is not a probe {noun} directory; choose a new or empty one"
            )
        if out.is_dir():  # staged files of a killed run: never renamed, so never counted (another run's lock: its own)
            remove_stale_temps(out, other_run=LOCK_NAME)

    def done(self, name: str) -> bool:
        return name in self.memory if self.out is None else record_path(self.out, name).is_file()

    def record(self, name: str) -> dict:
        """The stored record of a finished model."""
        return json.loads(self.memory[name]) if self.out is None else read_record(self.out, name)

    def put(self, name: str, record: dict) -> None:
        """Store a finished model's record (JSON-safe: NaN becomes null); the manifest comes first."""
        text = json.dumps(json_safe(record))
        if self.out is None:
            self.memory[name] = text
            return
        if not self.manifest_written:
            self.write_manifest()
        path = record_path(self.out, name)  # through write_files from --out: a link planted at models/ is refused
        write_files(self.out, {str(path.relative_to(self.out)): text})

    def write_manifest(self) -> None:
        if self.out is None:
            return
        kind = {} if self.kind == REPORT else {"kind": self.kind}
        manifest = {**kind, "settings": self.settings, "models": self.models, **self.extra}
        write_files(self.out, {MANIFEST: json.dumps(manifest, indent=1)})
        (self.out / MODELS).mkdir(exist_ok=True)
        self.manifest_written = True

    def _write_fingerprint(self, name: str, fingerprint: dict) -> None:
        (self.out / INPUTS).mkdir(exist_ok=True)
        path = fingerprint_path(self.out, name)
        write_files(self.out, {str(path.relative_to(self.out)): json.dumps(fingerprint)})

    def adopt_fingerprint(self, name: str, folder: Path) -> None:
        """Keep beside ``name``'s record the input fingerprints another run folder recorded for it (a shard's, in a
        merge), so that a resume here checks them; nothing when that folder recorded none."""
        path = fingerprint_path(folder, name)
        if self.out is not None and path.is_file():
            self._write_fingerprint(name, _read_state(path, "delete it, or run that shard again"))

    def check_fingerprints(self, names, fingerprint) -> None:
        """Every finished model of ``names`` was computed from the inputs ``fingerprint(name)`` finds now
        (docs/definitions.md#resume-fingerprints): a change is a one-line RunFolderError naming both; models finished
        before fingerprints existed get one warning and their fingerprints recorded."""
        unrecorded = []
        for name in (n for n in names if self.done(n)):
            now, path = fingerprint(name), fingerprint_path(self.out, name)
            was = (
                _read_state(path, "delete it and run again: it is recorded again from the inputs of now")
                if path.is_file()
                else None
            )
            if was is None or outdated(was):  # none, or one that hashed weight headers only: recorded anew
                unrecorded.append(name)
                self._write_fingerprint(name, now)
                continue
            if was != now:
                raise RunFolderError(
                    f"--out {str(self.out)!r}: model {name!r} was computed from other inputs "
                    f"({describe(was)}) than it reads now ({describe(now)}); restore them to resume, "
                    "delete its record to recompute it, or use another --out"
                )
        if unrecorded:
            stderr_note(
                f"warning: {len(unrecorded)} finished model(s) in {self.out} record no input fingerprints, or "
                f"ones of the weights' headers only (written before content fingerprints existed; first "
                f"{unrecorded[0]!r}); resuming with the inputs of now and recording them"
            )

    def records(self, names, compute, console: Console, what: str, fingerprint=None, unit: str = "model") -> list[dict]:
        """The record of every one of ``names``, in order: the stored one, or ``compute(name)``, stored as soon as it
        returns. A progress bar ``what`` counts the records (``unit``: what one is, a model or a report's (model,
        context) pair); the manifest is written by the end. With ``fingerprint`` (name -> the fingerprint of what
        that record is computed from), finished records are checked against it (:meth:`check_fingerprints`) and each
        new record is stored with it."""
        names = list(names)
        if fingerprint is not None and self.out is not None:
            self.check_fingerprints(names, fingerprint)
        todo = [n for n in names if not self.done(n)]
        if len(todo) < len(names):
            console.note(f"resuming {self.out}: {len(names) - len(todo)} of {len(names)} {unit}s already done")
        bar = console.bar(len(names), what, unit=unit)
        bar.update(len(names) - len(todo))
        try:
            for name in todo:
                bar.set_description(f"{what}: {name}")
                record = compute(name)
                if fingerprint is not None and self.out is not None:  # before the record, which marks it done
                    if not self.manifest_written:
                        self.write_manifest()
                    self._write_fingerprint(name, fingerprint(name))
                self.put(name, record)
                bar.update()
        except BaseException:
            bar.leave = False  # erase the bar: the error line is what stays on the terminal
            raise
        finally:
            bar.close()
        if not self.manifest_written:
            self.write_manifest()
        return [self.record(n) for n in names]


__all__ = [
    "RunStore",
    "RunFolderError",
    "MANIFEST",
    "MODELS",
    "slug",
    "record_path",
    "read_record",
    "read_manifest",
    "shard_name",
    "settings_diff",
]
