"""Writes that cannot be half-done or redirected, for every layer that writes (the trainer's checkpoints and
metrics, the zoo builders, corpora, run stores, result pages): each file staged in a new temp file of its folder
(``mkstemp``: exclusive, a random name, so a planted file or link is never opened), synced, then renamed into place;
an OSError is one ``WriteError`` naming the file. Standard library only, at the lowest level of the package."""

from __future__ import annotations

import errno
import math
import os
import re
import shutil
import tempfile
from pathlib import Path

TEMP_PREFIX = ".probe-tmp-"  # every staged file and folder starts so: a killed run's leftovers are recognisable
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # in a Python str every surrogate is a lone one


def clean_text(text: str) -> str:
    """``text`` as valid Unicode: each lone surrogate (a JSON ``\\udcff`` escape, a file name's undecodable byte as
    Python's surrogateescape keeps it) replaced by U+FFFD, the rule every text probe reads follows
    (docs/definitions.md#text-decoding). Clean text comes back as it is."""
    return _LONE_SURROGATE.sub("\ufffd", text) if _LONE_SURROGATE.search(text) else text


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
        view = view[os.write(fd, view) :]


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
    payload = data if isinstance(data, bytes) else clean_text(data).encode("utf-8")  # a name with undecodable bytes
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


def probe_cache(*parts: str) -> Path:
    """probe's cache folder (``$PROBE_CACHE``, else ``$XDG_CACHE_HOME/probe``, else ~/.cache/probe), joined with
    ``parts``: converted GGUF weights, file hashes, built C kernels. Nothing is created here."""
    base = os.environ.get("PROBE_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "probe"
    return Path(base).expanduser().joinpath(*parts)


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
            _write_all(fd, clean_text(line).encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        raise WriteError(path, e) from None


def remove_stale_temps(folder: Path, depth: int = 2, other_run: str | None = None) -> list[Path]:
    """Remove what a killed run staged and never renamed (names starting with ``TEMP_PREFIX``) in ``folder`` and its
    subfolders down to ``depth`` (probe stages beside its files: ``models/``, ``snapshots/``; a deeper walk could
    cross a whole tree passed as --out), links not followed. Run under the folder's lock (``probe.jobs.lock``), so
    nothing of this folder's is live; a subfolder holding a file named ``other_run`` (another run's lock file: a
    ``probe train --out D/run`` inside ``D``) is another run's and is not entered."""
    removed, top = [], len(Path(folder).parts)
    for root, dirs, files in os.walk(folder):  # os.walk does not descend into linked folders
        if other_run is not None:
            dirs[:] = [d for d in dirs if d.startswith(TEMP_PREFIX) or not os.path.lexists(Path(root, d, other_run))]
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


def check_real_folders(root: Path, path: Path) -> None:
    """Every folder from ``root`` (exclusive) down to ``path``'s parent is a real folder, not a link: a link planted
    as a subfolder of --out (``--out/models -> /elsewhere``) would send the writes below it elsewhere. A link is an
    OSError (ELOOP) naming it; ``root`` itself may be a link (the user chose it)."""
    root, at = Path(root), Path(root)
    for part in Path(path).parent.relative_to(root).parts:
        at = at / part
        if at.is_symlink():
            raise OSError(
                errno.ELOOP, f"{at} is a link; probe writes only into real folders of {root} (remove the link)", str(at)
            )


def staging_dir(parent: Path, name: str) -> Path:
    """A new, empty folder beside ``parent / name`` to build it in before one rename (a checkpoint): created
    exclusively (``mkdtemp``), recognisable as a killed run's leftover."""
    try:
        Path(parent).mkdir(parents=True, exist_ok=True)  # the first run or zoo folder is made here
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


def write_files(out: Path, files: dict[str, str | bytes]) -> list[Path]:
    """Write every file to a temp name first, then rename them all into ``out`` in the order given: no partial files
    on failure, and the last file lands last (a marker that the others are complete). Names may hold a subfolder of
    ``out`` that exists, never a link planted there (``check_real_folders``). An OSError (full disk, I/O error) is a
    ``WriteError`` naming the file; the temp files and the folders this call created are gone by then."""
    out = Path(out)
    staged, created, final = [], [], out
    try:
        created = make_dirs(out)
        for name, data in files.items():
            final = out / name
            check_real_folders(out, final)
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


def json_safe(x):
    """JSON-safe copy: NaN/inf -> None, numpy scalars -> Python."""
    if isinstance(x, dict):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
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
