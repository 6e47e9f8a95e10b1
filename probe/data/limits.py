"""What a run may read and allocate, checked before it does: files read are regular files of bounded size, and an
allocation must fit the memory available. Standard library only, so every layer can check the same way."""

from __future__ import annotations

import os
import stat
from pathlib import Path

MAX_INPUT_BYTES = 64 << 30  # one corpus file read whole: beyond this it cannot fit in any memory we run on


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1024 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PB"


def available_memory() -> int | None:
    """Bytes of memory a new allocation can take now (MemAvailable of /proc/meminfo, else free pages); None when
    the system does not say."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_fits(n_bytes: int, what: str) -> None:
    """A ``MemoryError`` naming ``what``, how much it needs and how much there is, unless ``n_bytes`` fits."""
    have = available_memory()
    if have is not None and n_bytes > have:
        raise MemoryError(
            f"{what} needs {human_bytes(n_bytes)}, more than the {human_bytes(have)} of memory "
            f"available (by {human_bytes(n_bytes - have)})"
        )


def file_kind(path: Path, mode: int) -> str:
    """What a path that is not a regular file is, in words ("a FIFO (through a link)")."""
    kind = (
        "a FIFO"
        if stat.S_ISFIFO(mode)
        else "a device"
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
        else "a socket"
        if stat.S_ISSOCK(mode)
        else "a directory"
        if stat.S_ISDIR(mode)
        else "not a regular file"
    )
    return kind + (" (through a link)" if Path(path).is_symlink() else "")


def check_windows_fit(n_bytes: int, what: str, fix: str) -> None:
    """Windows (or any input built whole before a forward) of ``n_bytes`` must fit in half the memory available, the
    other half left to the model and its forward; else a ``ValueError`` of one line: ``what`` needs ..., ``fix``."""
    have = available_memory()
    if have is not None and 2 * n_bytes > have:
        raise ValueError(
            f"{what} need {human_bytes(n_bytes)}, more than half the {human_bytes(have)} of memory available "
            f"(the rest is the model's); {fix}"
        )


def check_input_file(path, max_bytes: int = MAX_INPUT_BYTES) -> Path:
    """``path`` is a regular file (a link to one is fine) of at most ``max_bytes``, else a ``ValueError`` naming it:
    a FIFO or a device would block or never end, a directory is no text."""
    path = Path(path)
    try:
        st = os.stat(path)
    except OSError as e:
        raise ValueError(f"{path}: cannot read it ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{path} is {file_kind(path, st.st_mode)}, not a regular file; pass a regular text file")
    if st.st_size > max_bytes:
        raise ValueError(
            f"{path} holds {human_bytes(st.st_size)}, more than the {human_bytes(max_bytes)} a corpus file may hold"
        )
    return path


__all__ = [
    "MAX_INPUT_BYTES",
    "human_bytes",
    "available_memory",
    "check_fits",
    "check_input_file",
    "check_windows_fit",
    "file_kind",
]
