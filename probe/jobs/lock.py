"""One writer per run folder: every verb that writes ``--out`` holds an exclusive ``fcntl.flock`` on
``--out/.probe.lock`` while it runs, the file naming the holder (PID, host, start time, command).

A second process on a held folder stops with one line naming the holder (exit code 2), or queues behind it with
``--wait``. The kernel drops a flock when its process dies, so a lock file left by a killed run on this host is taken
over. A lock file naming another host is reported and not taken: a flock on a network filesystem need not reach this
host, so only a person can tell whether that run is over. A lock file whose content is not a probe lock record (not
JSON, a PID that is not a positive number, a host that is not a name) names no holder: under the flock it is a
killed run's, taken over with one note. The holder removes the file when it is done; on taking the lock it removes
what a killed run staged and never renamed (``probe.writes.remove_stale_temps``), since nothing else can be writing
there, except inside a subfolder that holds another run's lock file. Notes go to stderr, none under ``--quiet``.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import socket
import stat
import sys
import time
from pathlib import Path

from probe.console import note as stderr_note
from probe.errors import UsageError
from probe.writes import WriteError, make_dirs, remove_empty_dirs, remove_stale_temps

LOCK_NAME = ".probe.lock"
MAX_PID = 2**22  # Linux's pid_max ceiling: a larger "pid" was not written by a process


def this_host() -> str:
    return socket.gethostname()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    except OSError:  # not a pid this system has
        return False
    return True


def _read_holder(fd: int) -> dict:
    """The holder a lock file names: {} when empty (a holder killed before it wrote), {"unreadable": why} when its
    content is not a probe lock record, else its fields (pid an int 1..MAX_PID, host, started, command: strings)."""
    try:
        data = os.pread(fd, 4096, 0)
    except OSError:
        return {"unreadable": "it cannot be read"}
    if not data.strip():
        return {}
    try:
        holder = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):
        return {"unreadable": "it is not JSON"}
    if not isinstance(holder, dict):
        return {"unreadable": "it is not a JSON object"}
    pid = holder.get("pid")
    if isinstance(pid, bool) or not isinstance(pid, int) or not 0 < pid <= MAX_PID:
        return {"unreadable": f"its pid {str(pid)[:40]!r} is not a process id"}
    if not all(isinstance(holder.get(k, ""), str) for k in ("host", "started", "command")):
        return {"unreadable": "its host, start or command is not text"}
    return {"pid": pid, **{k: holder[k][:300] for k in ("host", "started", "command") if k in holder}}


def describe(holder: dict) -> str:
    if not holder or "unreadable" in holder:
        return "another probe process"
    since = f" since {holder['started']}" if holder.get("started") else ""
    command = f" ({holder['command']})" if holder.get("command") else ""
    return f"pid {holder.get('pid')} on host {holder.get('host')}{since}{command}"


class FolderLock:
    """The held lock of one run folder; ``release()`` (or leaving the ``with`` block) gives it up."""

    def __init__(self, folder: Path, fd: int, created: list[Path]):
        self.folder, self.fd, self.created = folder, fd, created
        self.path = folder / LOCK_NAME

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)  # while still held: a process that opened it re-checks the inode
        finally:
            os.close(self.fd)  # drops the flock
            self.fd = None
        remove_empty_dirs(self.created)  # a run that wrote nothing leaves no empty --out behind

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


def acquire(folder, *, wait: bool = False, flag: str = "--out", prog: str = "probe", note=None) -> FolderLock:
    """Hold ``folder``'s lock (creating the folder when missing), else a ``UsageError`` naming the holder.

    ``wait``: block until the holder is done instead; ``note``: where a line on waiting or on taking over a killed
    run's lock goes (default stderr)."""
    folder = Path(folder)
    note = note or (lambda line: stderr_note(f"{prog}: {line}"))
    path = folder / LOCK_NAME
    try:
        created = make_dirs(folder)
    except OSError as e:
        raise UsageError(
            f"{flag} {str(folder)!r} is not a writable directory ({e.strerror}); choose a directory you can write to",
            prog,
        ) from None
    try:
        for attempt in itertools.count():
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            except FileNotFoundError:
                if attempt < 100:  # the holder we waited for removed the folder it had created: make it again
                    created += make_dirs(folder)
                    continue
                raise
            except OSError as e:
                raise UsageError(
                    f"{flag} {str(folder)!r}: cannot open its lock file {path} ({e.strerror}); remove "
                    "it if it is not a regular file",
                    prog,
                ) from None
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise UsageError(
                        f"{flag} {str(folder)!r}: its lock file {path} is not a regular file; remove it", prog
                    )
                if not _lock(fd, path, wait, flag, folder, prog, note):
                    continue  # the file was removed by the holder that released it: lock the new one
                holder = _read_holder(fd)
                if holder.get("host") not in (None, this_host()):
                    raise UsageError(
                        f"{flag} {str(folder)!r} is locked by {describe(holder)}: a run on another host; "
                        f"if it has ended, remove {path} and run again",
                        prog,
                    )
                if "unreadable" in holder:
                    note(f"taking over the lock of {folder}: {path} is no probe lock record ({holder['unreadable']})")
                elif holder.get("pid") not in (None, os.getpid()):
                    state = "no longer running" if not _pid_alive(holder["pid"]) else "not holding it"
                    note(f"taking over the lock of {folder} left by pid {holder['pid']} ({state})")
                _write_holder(fd, path)
            except BaseException:
                os.close(fd)
                raise
            lock = FolderLock(folder, fd, created)
            removed = remove_stale_temps(folder, other_run=LOCK_NAME)
            if removed:
                note(f"removed {len(removed)} staged file(s) a killed run left in {folder}")
            return lock
    except BaseException:
        remove_empty_dirs(created)
        raise


def _lock(fd: int, path: Path, wait: bool, flag: str, folder: Path, prog: str, note) -> bool:
    """flock ``fd``; False when ``path`` no longer names the locked file (its holder unlinked it meanwhile)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_holder(fd)
        if not wait:
            raise UsageError(
                f"{flag} {str(folder)!r} is in use by {describe(holder)}; wait for it to finish, pass "
                f"--wait to queue behind it, or choose another {flag}",
                prog,
            ) from None
        note(f"waiting for {describe(holder)} to release {folder}")
        fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        same = os.fstat(fd).st_ino == os.stat(path, follow_symlinks=False).st_ino
    except FileNotFoundError:
        same = False
    if not same:
        os.close(fd)
    return same


def _write_holder(fd: int, path: Path) -> None:
    """Name this process in the held lock file; a full disk is a WriteError naming the file, which is then removed
    (a new --out is left as it was)."""
    holder = {
        "pid": os.getpid(),
        "host": this_host(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join(["probe", *sys.argv[1:]])[:300],
    }
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder).encode("utf-8"), 0)
        os.fsync(fd)
    except OSError as e:
        path.unlink(missing_ok=True)  # still held: no other process opened it as the lock meanwhile
        raise WriteError(path, e) from None


__all__ = ["LOCK_NAME", "FolderLock", "acquire", "describe", "this_host"]
