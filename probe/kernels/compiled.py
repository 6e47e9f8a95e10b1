"""backend="compiled": an op's own eager math, fused into one kernel per pass by ``torch.compile`` (Inductor: C++ with
OpenMP and SIMD on CPU, Triton on CUDA).

The row rules' fused paths (softpick, the pointwise rules, stick-breaking) make a dozen elementwise passes over each
block of scores, each a separate eager op that reads and writes the whole block; on a CPU these passes, not the matrix
products, set a training step's time. Compiled, each forward and each backward is a few loops over the block. The
compiled function is the eager one (``compiled(fn)(*args) == fn(*args)`` up to summation order), so the eager path is
its reference and tests compare the two on outputs and gradients.

The first call of each function compiles it (seconds; Inductor keeps its code in its on-disk cache, so later processes
reuse it), with dynamic shapes: the blocks of a causal row change their key count without a recompile. It needs what
Inductor needs on CPU: a C++ compiler. Where compiling fails, the op raises in one line naming the other backends.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

import torch

F = TypeVar("F", bound=Callable)

# One compiled function serves every rule setting that its Python arguments pick (the kernel, whether rows normalise,
# the bias) and every dtype: each is a compile of its own, so the limit is raised past torch's default of 8.
RECOMPILE_LIMIT = 64


@functools.cache
def cpp_compiler() -> str | None:
    """The C++ compiler Inductor compiles CPU code with (its $CXX search), or None where it finds none."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        return get_cpp_compiler()
    except Exception:  # Inductor's InvalidCxxCompiler, or a torch without it
        return None


@functools.cache
def _compiled(fn: Callable) -> Callable:
    return torch.compile(fn, dynamic=True, fullgraph=True)


def compiled(fn: F, on: bool = True) -> F:
    """``fn`` compiled by torch.compile where ``on`` (its wrapper built once per function), else ``fn`` itself. A
    compile that fails raises a RuntimeError in one line, naming the eager backends."""
    return _checked(fn) if on else fn  # type: ignore[return-value]


@functools.cache
def _checked(fn: Callable) -> Callable:
    """``fn``'s compiled form behind the one-line errors."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        on_cpu = any(isinstance(a, torch.Tensor) and a.device.type == "cpu" for a in args)
        if on_cpu and cpp_compiler() is None:
            raise RuntimeError(
                "backend='compiled' needs a C++ compiler on CPU (Inductor looks for g++, or $CXX) and found none; "
                "use backend 'torch' or 'reference'"
            )
        try:
            with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
                return _compiled(fn)(*args, **kwargs)
        except torch._dynamo.exc.BackendCompilerFailed as e:  # no C++ compiler, or Inductor cannot lower fn
            cause = getattr(e, "inner_exception", None) or e
            first = (str(cause).strip().splitlines() or [""])[0]
            raise RuntimeError(
                f"backend='compiled' could not compile {fn.__qualname__} ({type(cause).__name__}: {first}); "
                "use backend 'torch' or 'reference'"
            ) from e

    return call
