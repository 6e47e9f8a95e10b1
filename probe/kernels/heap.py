"""Freed memory kept in the process for reuse, on CPU: glibc's malloc otherwise hands large blocks back to the OS.

A CPU training step allocates and frees the same large tensors every step (activations, their gradients, the logits'
B x T x vocab). glibc serves a block above its mmap threshold (128 KB, rising to at most 32 MB as blocks are freed)
with a fresh mmap and unmaps it when freed, and trims the heap's top above its trim threshold: every step then faults
in and zeroes those pages again. ``keep_freed_memory`` sets both thresholds high (mallopt), so a freed block stays in
the process and the next step reuses it: at the tiny tier (batch 16, 256 tokens) a training step took 0.475 s in
place of 0.61 s (benchmarks/attention_rules_throughput.py's softmax model, the same machine, back to back; the
CHANGELOG). The cost: the process keeps its peak memory, and somewhat more, until it exits. torch allocates with
posix_memalign, and glibc 2.36's aligned allocation leaves a small remainder (in its thread cache) between a block
and the heap's top, so a block freed and asked for again at once is not always reused: the heap takes another, and a
loop's first steps may grow it by a block or two before its steady state, where no step faults pages in again
(tests/kernels/test_heap.py). Measured at the tiny tier (batch 8, 128 tokens, 40 AdamW steps, one thread): RSS 872 MB
kept against 659 MB by default, flat from the 20th step on. What torch users do with jemalloc or tcmalloc
preloaded, in place, for glibc only: elsewhere it does nothing and says so by returning False.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import platform

from probe.kernels.common import switched_off

ENV_VAR = "PROBE_KEEP_FREED_MEMORY"  # "0": leave glibc's thresholds as they are
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's <malloc.h> parameter numbers
MMAP_THRESHOLD = 1 << 30  # blocks up to 1 GiB come from the heap (and go back to it)
TRIM_THRESHOLD = (1 << 31) - 1  # the heap's top is never trimmed below 2 GiB of free space


@functools.cache
def _mallopt():
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    fn = libc.mallopt
    fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return fn


def keep_freed_memory() -> bool:
    """Keep freed blocks for reuse from now on (glibc; not where ``PROBE_KEEP_FREED_MEMORY=0``). True where both
    thresholds were set."""
    if switched_off(ENV_VAR):
        return False
    mallopt = _mallopt()
    if mallopt is None:
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
