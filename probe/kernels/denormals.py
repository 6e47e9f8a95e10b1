"""Denormal floats flushed to zero on every thread that runs torch's CPU ops, not only the caller's.

``torch.set_flush_denormal`` sets the FTZ/DAZ bits of the calling thread's MXCSR alone. torch's intra-op pool is
OpenMP (libgomp, torch's own copy) on Linux, and its worker threads, made before the call, keep computing denormals:
an op split across two threads waits for the slow one, so with 2 threads a bmm over denormal inputs ran as slowly
flushed as not (163 ms and 164 ms, against 1.9 ms on the flushing thread alone; benchmarks in the CHANGELOG).
``set_flush_denormal`` here runs torch's own call once on each thread of one OpenMP parallel region of the pool's
size, from the thread whose pool torch uses: the pool's threads persist across regions, so every later op runs
flushed (tests/kernels/test_denormals.py times it).

The region is started through libgomp's ``GOMP_parallel`` (its entry point for ``#pragma omp parallel`` since GCC
4.9) with a ctypes callback, so no compiler is needed. Where torch's pool is not libgomp (macOS's libomp, a build
with another parallel backend) only the calling thread flushes, as torch's call does, and the function says so by
returning False.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

_REGION = ctypes.CFUNCTYPE(None, ctypes.c_void_p)  # void (*fn)(void *data): an OpenMP region's body


@functools.cache
def _libgomp() -> ctypes.CDLL | None:
    """torch's libgomp (its own copy where the wheel ships one, else the one loaded), or None where torch's pool is
    not OpenMP or none is loaded. Other wheels vendor theirs under other names (sentencepiece: libgomp-<hash>)."""
    if "OpenMP" not in torch.__config__.parallel_info():
        return None
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    own = str(Path(torch.__file__).parent / "lib" / "libgomp.so.1")
    paths = {line.split()[-1] for line in maps.splitlines() if "/libgomp.so" in line}
    path = own if own in paths else (paths.pop() if len(paths) == 1 else None)
    if path is None:
        return None
    lib = ctypes.CDLL(path)  # already loaded: the same handle
    lib.GOMP_parallel.argtypes = [_REGION, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
    lib.GOMP_parallel.restype = None
    return lib


def set_flush_denormal(on: bool) -> bool:
    """Denormal floats read and written as zero (``on``), or kept, on this thread and on each of torch's intra-op
    threads. True where every thread was set; False where the CPU has no such mode (torch's call returns False) or
    only this thread was (no libgomp pool)."""
    if not torch.set_flush_denormal(on):
        return False
    lib = _libgomp()
    if lib is None:
        return False
    body = _REGION(lambda _data: torch.set_flush_denormal(on))  # kept alive until the region ends
    lib.GOMP_parallel(body, None, torch.get_num_threads(), 0)
    return True
