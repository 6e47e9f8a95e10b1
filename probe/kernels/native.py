"""The row rules' C kernels on CPU (``rows.c`` beside a rule's fused.py): built on first use with the machine's C
compiler, kept in probe's cache, loaded with ctypes.

Why C: a row rule's torch ops (softpick, stick-breaking) make a dozen passes over each block of (B, H, b, n) scores,
each a separate op that reads and writes the whole block from memory; on a CPU these passes, not the matrix
products, set a training step's time. A C kernel runs a row's passes while the row sits in cache, so the forward and
the backward each read and write the block about once (benchmarks/attention_rules_throughput.py). The kernels
compute the rule's fused.py function (tests/kernels/test_native_rows.py compares values and gradients with it).

    build     ``$CC`` (else cc, gcc or clang) -O3 -march=native -ffp-contract=fast -fno-math-errno -fopenmp -shared
              (and -mprefer-vector-width=512 on x86-64), with glibc's
              vector math (-lmvec) on x86-64 Linux; the OpenMP runtime is torch's own (torch ships libgomp.so.1, the
              soname the link asks for), so the kernels share torch's thread pool
    cache     ``$PROBE_CACHE/native`` (default ~/.cache/probe/native): one shared library per kernel source, compiler
              and CPU (-march=native), staged and renamed into place, so processes building at once do not clash;
              loaded only where the folder and the file are this user's and no one else may write them
    off       ``PROBE_NATIVE=0`` builds and loads nothing: the rules run their torch ops (as they do where no
              compiler is found, or the build fails: warned once, naming the compiler's first error line)

The runtime backend decides who runs them (probe.kernels.rule_attention): "auto", the default, takes the kernels for
fp32 / fp64 CPU scores where they build; "torch" keeps the torch ops; "compiled" torch.compile's code.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from probe.kernels.common import switched_off
from probe.writes import probe_cache

ENV_VAR = "PROBE_NATIVE"
HEADER = Path(__file__).with_name("native_rows.h")
# -ffp-contract=fast: multiply-adds fused (-std=c11 alone turns contraction off); on x86-64 512-bit vectors where
# the CPU has them (gcc's default stops at 256: the stream kernels' passes run about 15% faster)
FLAGS = ("-O3", "-march=native", "-ffp-contract=fast", "-fno-math-errno", "-fopenmp", "-fPIC", "-shared", "-std=c11")
X86_FLAGS = ("-mprefer-vector-width=512",)
DTYPES = {torch.float32: "float", torch.float64: "double"}  # the kernels' element types, by function-name suffix


def enabled() -> bool:
    """False where ``PROBE_NATIVE=0`` (or "false", "off", "no")."""
    return not switched_off(ENV_VAR)


@functools.cache
def c_compiler() -> str | None:
    """$CC, else the first of cc, gcc, clang on PATH; None where there is none."""
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and (path := shutil.which(name)):
            return path
    return None


def _vector_math() -> bool:
    """glibc's libmvec (vector exp) exists on x86-64 Linux; elsewhere exp stays scalar."""
    linux_x86 = platform.system() == "Linux" and platform.machine() in ("x86_64", "AMD64")
    return linux_x86 and platform.libc_ver()[0] == "glibc"


@functools.cache
def _compiler_version(cc: str) -> str:
    return (subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.splitlines() or [""])[0]


@functools.cache
def _cpu_key() -> str:
    """What -march=native depends on: the CPU's feature flags (Linux), else the machine and processor names."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor()}"


def _build_command(cc: str, source: Path, out: Path) -> list[str]:
    extra = (["-DPROBE_LIBMVEC"], ["-lmvec"]) if _vector_math() else ([], [])
    arch = X86_FLAGS if platform.machine().lower() in ("x86_64", "amd64") else ()
    return [cc, *FLAGS, *arch, *extra[0], f"-I{HEADER.parent}", str(source), "-o", str(out), *extra[1], "-lm"]


@functools.cache
def library(source: Path) -> ctypes.CDLL | None:
    """The kernels of C file ``source``, built once per compiler and CPU and cached; None where native kernels are
    off, no compiler is found, or the build or the load fails (warned once)."""
    if not enabled() or (cc := c_compiler()) is None:
        return None
    key = hashlib.sha256()
    for part in (source.read_bytes(), HEADER.read_bytes(), " ".join(_build_command(cc, source, Path())).encode()):
        key.update(part)
    key.update(f"{_compiler_version(cc)} {_cpu_key()} {torch.__version__}".encode())
    folder = probe_cache("native")
    target = folder / f"{source.parent.name}-{source.stem}-{key.hexdigest()[:20]}.so"
    try:
        if not target.is_file():
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            _build(cc, source, target)
        _check_private(folder, target)
        return ctypes.CDLL(str(target))
    except (OSError, RuntimeError) as e:
        warnings.warn(
            f"probe's C kernels of {source.parent.name} did not build ({e}); its torch ops run instead", stacklevel=3
        )
        return None


def _check_private(folder: Path, target: Path) -> None:
    """Load only a library this user owns, in a folder and a file no one else may write: a shared or planted cache
    would run another user's code in this process. Raises RuntimeError naming what is wrong."""
    if not hasattr(os, "getuid"):
        return
    for path in (folder, target):
        st = os.stat(path)
        if st.st_uid != os.getuid() or st.st_mode & 0o022:
            raise RuntimeError(f"{path} is not this user's alone (owner uid {st.st_uid}, mode {st.st_mode & 0o777:o})")


def _build(cc: str, source: Path, target: Path) -> None:
    """Compile ``source`` into a temp file beside ``target`` and rename it into place."""
    fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        done = subprocess.run(_build_command(cc, source, Path(tmp)), capture_output=True, text=True, timeout=300)
        if done.returncode:
            errors = [line for line in done.stderr.splitlines() if "error" in line] or done.stderr.splitlines()
            raise RuntimeError(f"{Path(cc).name} exited {done.returncode}: {(errors or [''])[0].strip()}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def kernel(source: Path, name: str, dtype: torch.dtype) -> Callable | None:
    """Function ``name_<float|double>`` of ``source``'s library for tensors of ``dtype``, or None where it has none."""
    lib = library(source)
    if lib is None or dtype not in DTYPES:
        return None
    return getattr(lib, f"{name}_{DTYPES[dtype]}")


def kernel_for(source: Path, name: str, *tensors: torch.Tensor) -> Callable | None:
    """``kernel(source, name, dtype)`` where the C kernels take ``tensors`` (``runs_natively``), else None."""
    return kernel(source, name, tensors[0].dtype) if runs_natively(*tensors) else None


def runs_natively(*tensors: torch.Tensor) -> bool:
    """Can the C kernels take these tensors: on CPU, contiguous, of one dtype they have (fp32, fp64)?"""
    first = tensors[0]
    return all(t.device.type == "cpu" and t.is_contiguous() and t.dtype == first.dtype for t in tensors) and (
        first.dtype in DTYPES
    )


def call(fn: Callable, *args) -> int:
    """``fn(*args)`` with tensors passed as data pointers (None as NULL), ints as int64 and floats as double, then the
    thread count (torch's intra-op threads); returns what ``fn`` returns (an int: 0 for a kernel that did its job, where
    it says). ctypes releases the GIL for the call."""
    converted: list[object] = []
    for a in args:
        if a is None:  # a gradient not asked for: NULL
            converted.append(ctypes.c_void_p(None))
        elif isinstance(a, torch.Tensor):
            converted.append(ctypes.c_void_p(a.data_ptr()))
        elif isinstance(a, float):
            converted.append(ctypes.c_double(a))
        else:
            converted.append(ctypes.c_int64(int(a)))
    return fn(*converted, ctypes.c_int(torch.get_num_threads()))
