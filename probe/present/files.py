"""Results as files and text, for the CLI verbs, ``probe report`` and the experiment recipes: files written atomically
(CSV, JSON, self-contained offline HTML pages of plotly figures), readable tables and JSON on stdout.

The page builders (probe.present.page: pandas, plotly) are imported where a page is written, so ``check_out_dir`` and
``emit`` cost no heavy import (``probe models`` answers within a second)."""
from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from probe.present.console import Console
from probe.present.errors import UsageError


@dataclass(frozen=True)
class OutputSpec:
    """Where results go besides the readable text on stdout."""

    out: Path | None = None  # CSV, JSON and HTML files go here; None: nothing written
    as_json: bool = False  # stdout carries the JSON document instead of the text
    quiet: bool = False  # no notes or progress bars on stderr
    self_contained: bool = False  # pages inline plotly.js instead of loading the folder's shared plotly.min.js
    writer: bool = True  # False on the ranks of a multi-process run other than rank 0: they neither write nor print


def clean(x):
    """JSON-safe copy: NaN/inf -> None, numpy scalars -> Python."""
    if isinstance(x, dict):
        return {str(k): clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    if hasattr(x, "item") and not isinstance(x, (str, bytes)):
        try:
            x = x.item()
        except (ValueError, AttributeError):
            return str(x)
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    return str(x)


def result_meta(result: dict) -> dict:
    meta = result.get("meta")
    if meta is None:
        return {}
    return dict(meta.attrs.get("meta") or meta.iloc[0].to_dict())


def result_json(verb: str, result: dict) -> dict:
    return clean({"verb": verb, "meta": result_meta(result),
                  "tables": {k: v.to_dict("records") for k, v in result.items() if k != "meta"}})


TEMP_PREFIX = ".probe-tmp-"  # every staged file and folder starts so: a killed run's leftovers are recognisable


class WriteError(Exception):
    """A file the run could not write (full disk, quota, I/O error): one line naming the file and the error, exit
    code 1 on the command line (the run failed; the flags were fine)."""

    def __init__(self, path, error: OSError):
        self.path, self.error = Path(path), error
        super().__init__(f"cannot write {self.path}: {error.strerror or type(error).__name__}")


def _file_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


FILE_MODE = _file_mode()  # what open(..., "w") would give: mkstemp's own 0600 would hide results from the group


def _write_all(fd: int, data: bytes) -> None:
    """Every byte of ``data`` to ``fd`` (os.write may write fewer)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _fsync_dir(folder: Path) -> None:
    """Make the renames in ``folder`` durable (a crash after the rename must not lose the file's name)."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on a directory; the file itself is synced
    finally:
        os.close(fd)


def _stage(final: Path, data: str | bytes) -> Path:
    """``data`` in a new temp file beside ``final``, synced to disk: created exclusively (``mkstemp``: O_EXCL with a
    random name, so a planted file or link is never opened, let alone written through)."""
    payload = data if isinstance(data, bytes) else data.encode("utf-8")
    fd, tmp = tempfile.mkstemp(prefix=f"{TEMP_PREFIX}{final.name[:60]}.", dir=final.parent)
    try:
        os.fchmod(fd, FILE_MODE)
        _write_all(fd, payload)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    return Path(tmp)


def make_dirs(folder: Path) -> list[Path]:
    """Create ``folder`` and its missing parents; the folders created, outermost first."""
    created = []
    for parent in [*reversed(folder.parents), folder]:
        if not parent.exists():
            parent.mkdir()
            created.append(parent)
    return created


def remove_empty_dirs(folders: list[Path]) -> None:
    for folder in reversed(folders):
        try:
            folder.rmdir()
        except OSError:
            pass


def atomic_write(path: Path, data: str | bytes) -> None:
    """``path`` holds ``data`` whole or keeps what it held: staged in a temp file of its folder, synced, renamed over
    it (a link planted at ``path`` is replaced, never followed). An OSError is a ``WriteError`` naming ``path``."""
    write_files(Path(path).parent, {Path(path).name: data})


def append_line(path: Path, line: str) -> None:
    """Append one line to a log (``metrics.jsonl``): opened without following a link planted at ``path``, synced."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), FILE_MODE)
        try:
            _write_all(fd, line.encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        raise WriteError(path, e) from None


def remove_stale_temps(folder: Path, depth: int = 2) -> list[Path]:
    """Remove what a killed run staged and never renamed (names starting with ``TEMP_PREFIX``) in ``folder`` and its
    subfolders down to ``depth`` (probe stages beside its files: ``models/``, ``snapshots/``; a deeper walk could
    cross a whole tree passed as --out), links not followed. Run under the folder's lock (``probe.jobs.lock``), so
    nothing live is removed."""
    removed, top = [], len(Path(folder).parts)
    for root, dirs, files in os.walk(folder):  # os.walk does not descend into linked folders
        if len(Path(root).parts) - top >= depth:
            dirs[:] = [d for d in dirs if d.startswith(TEMP_PREFIX)]  # leftovers here still go, nothing below
        for name in [d for d in dirs if d.startswith(TEMP_PREFIX)]:
            dirs.remove(name)
            target = Path(root) / name
            if target.is_symlink():
                target.unlink()
            else:
                shutil.rmtree(target, ignore_errors=True)
            removed.append(target)
        for name in files:
            if name.startswith(TEMP_PREFIX):
                (Path(root) / name).unlink(missing_ok=True)
                removed.append(Path(root) / name)
    return removed


def staging_dir(parent: Path, name: str) -> Path:
    """A new, empty folder beside ``parent / name`` to build it in before one rename (a checkpoint): created
    exclusively (``mkdtemp``), recognisable as a killed run's leftover."""
    try:
        Path(parent).mkdir(parents=True, exist_ok=True)  # a first zoo folder or run folder: made here, as before
        return Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{name[:60]}.", dir=parent))
    except OSError as e:
        raise WriteError(Path(parent) / name, e) from None


def fsync_tree(folder: Path) -> None:
    """Sync every file under a staged folder and the folder itself, before it is renamed into place (a checkpoint
    that a crash after the rename finds empty would be worse than the previous one)."""
    for root, _, files in os.walk(folder):
        for name in files:
            fd = os.open(Path(root) / name, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(root))


def check_out_dir(out, flag: str = "--out", prog: str = "probe") -> Path:
    """Fail fast (a ``UsageError``, before any model is loaded) unless ``out`` is, or can become, a writable directory.

    Really tries: creates the missing folders and a temporary file (a new name, created exclusively: nothing there is
    opened or truncated), then removes what it created, so a path under a regular file, under /proc or on a read-only
    mount is one line here instead of a traceback after the work."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"{flag} {str(out)!r} is a file, not a directory; choose a new or existing directory", prog)
    created = []
    try:
        created = make_dirs(out)
        fd, tmp = tempfile.mkstemp(prefix=f"{TEMP_PREFIX}write-check.", dir=out)
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        raise UsageError(f"{flag} {str(out)!r} is not a writable directory ({e.strerror or type(e).__name__}); "
                         "choose a directory you can write to", prog) from None
    finally:
        remove_empty_dirs(created)
    return out


def write_files(out: Path, files: dict[str, str | bytes]) -> list[Path]:
    """Write every file to a temp name first, then rename them all into ``out`` in the order given: no partial files
    on failure, and the last file lands last (a marker that the others are complete). Names may hold a subfolder of
    ``out`` that exists. An OSError (full disk, I/O error) is a ``WriteError`` naming the file; the temp files and
    the folders this call created are gone by then."""
    out = Path(out)
    staged, created, final = [], [], out
    try:
        created = make_dirs(out)
        for name, data in files.items():
            final = out / name
            staged.append((_stage(final, data), final))
        for tmp, final in staged:
            os.replace(tmp, final)
        for folder in {f.parent for _, f in staged}:
            _fsync_dir(folder)
    except OSError as e:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        if not any(f.exists() for _, f in staged):
            remove_empty_dirs(created)
        raise WriteError(final, e) from None
    except BaseException:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        raise
    return [final for _, final in staged]


def write_pages(out: Path, files: dict[str, str | bytes]) -> list[Path]:
    """``write_files`` for a folder of pages: plotly.min.js first when a page loads it and the folder lacks it, then
    the files in order, then the folder's index.html rebuilt from everything in it."""
    from probe.present.page import INDEX, index_page, support_files

    out = Path(out)
    written = write_files(out, {**support_files(out, files), **files})
    atomic_write(out / INDEX, index_page(out))
    return written


def save_result(output: OutputSpec, stem: str, result: dict, figures, console: Console, title: str,
                sections: dict | None = None) -> None:
    """With ``output.out``: one CSV per table, one JSON with everything, one HTML page (``sections``: the verdicts,
    caveats and tables it opens with, as ``probe.present.page.page`` takes them), the folder's index."""
    if not output.out:
        return
    from probe.present.page import page

    files = {f"{stem}_{k}.csv": v.to_csv(index=False) for k, v in result.items()}
    files[f"{stem}.json"] = json.dumps(result_json(stem, result), indent=1)
    if figures or sections:
        files[f"{stem}.html"] = page(title, figures, intro=clean(result_meta(result)), **(sections or {}),
                                     self_contained=output.self_contained)
    written = write_pages(Path(output.out), files)
    console.note(f"wrote {len(written)} files to {output.out}: " + ", ".join(p.name for p in written))


def show(df, columns=None, digits: int = 4, identity: bool = False) -> str:
    """A table for stdout: selected columns (identity columns and all-empty ones dropped), compact floats."""
    cols = [c for c in (columns or df.columns) if c in df.columns and df[c].notna().any()
            and (identity or c not in ("model", "corpus"))]
    return df[cols].to_string(index=False, float_format=lambda x: f"{x:.{digits}g}", na_rep="-")


def header(meta: dict) -> str:
    w = (f"{meta.get('n_batches')} x {meta.get('batch_size')} windows of {meta.get('ctx')} tokens "
         f"({meta.get('mode', '?')}{', BOS first' if meta.get('bos') else ''})") if meta.get("ctx") else ""
    return "\n".join(s for s in (f"model:  {meta.get('model')}",
                                 f"corpus: {meta.get('corpus')} (tokenizer {meta.get('tokenizer')})"
                                 if meta.get("corpus") else "", f"windows: {w}" if w else "") if s)


def emit(output: OutputSpec, verb: str, result: dict, text: str) -> None:
    """stdout: the JSON document with ``output.as_json`` (--json), else the readable text (nothing on the ranks that
    do not write)."""
    if not output.writer:
        return
    if output.as_json:
        print(json.dumps(result_json(verb, result), indent=1))
    else:
        print(text)


def publish(output: OutputSpec, stem: str, result: dict, presentation, console: Console,
            figure_inputs: dict | None = None) -> None:
    """An analysis verb's outputs, shaped by its presentation module (``probe.present.<analysis>``: ``TITLE``,
    ``figures(result, **figure_inputs)``, ``sections(result)``, ``text(result)``): with ``output.out`` the CSVs, the
    JSON document and the page (``save_result``), then the terminal text or the JSON on stdout (``emit``).
    ``figure_inputs``: tables a figure draws that are not written as files (dormant heads' per-input rows)."""
    if output.out:
        save_result(output, stem, result, presentation.figures(result, **(figure_inputs or {})), console,
                    presentation.TITLE,
                    presentation.sections(result))
    emit(output, stem, result, presentation.text(result))
