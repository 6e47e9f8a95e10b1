"""Which implementation the ops run: a runtime choice, never part of a saved model.

    auto       Triton on CUDA where it applies, else the fused torch path (SDPA / CPU flash) or the reference
    torch      the torch paths: the fused one, the reference where a pattern is asked for
    reference  the readable fp32 reference everywhere (materialises T x T)
    sdpa       the fused torch path (no pattern)
    compiled   the torch paths, with the row rules' math (softpick, the pointwise rules, stick-breaking) compiled by
               torch.compile (probe.kernels.compiled; Inductor's C++ on CPU, needs a C++ compiler); every other op
               runs its torch path
    triton     the Triton kernels (CUDA, or CPU under TRITON_INTERPRET=1)

Precedence, read when an op runs: an explicit ``backend=`` argument, then the innermost ``use_backend(...)`` block,
then the ``PROBE_BACKEND`` environment variable, then "auto". Each op's dispatch (probe.kernels.<op>.dispatch) maps
the choice to its own paths. Triton is imported only when a Triton path is taken; ``check_triton`` is what an
explicit backend="triton" asks of the tensors' device.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os

import torch

BACKENDS = ("auto", "torch", "reference", "sdpa", "triton", "compiled")
ENV_VAR = "PROBE_BACKEND"

TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # what backend="auto" sends to a Triton kernel

_chosen: contextvars.ContextVar[str | None] = contextvars.ContextVar("probe_backend", default=None)


def check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    return backend


def current_backend() -> str:
    """The backend in force here: the innermost ``use_backend`` block, else $PROBE_BACKEND, else "auto"."""
    chosen = _chosen.get()
    if chosen is not None:
        return chosen
    env = os.environ.get(ENV_VAR, "").strip()
    if env:
        if env not in BACKENDS:
            raise ValueError(f"{ENV_VAR}={env!r} is not a backend; choose one of {', '.join(BACKENDS)}")
        return env
    return "auto"


def resolve_backend(backend: str | None) -> str:
    """An op's ``backend=`` argument: None means the runtime choice (``current_backend()``)."""
    return current_backend() if backend is None else check_backend(backend)


@contextlib.contextmanager
def use_backend(backend: str | None):
    """``with use_backend("triton"): model(ids)`` — every op inside the block runs on ``backend`` unless an op is
    given one explicitly. ``None`` leaves the choice as it is (so callers can pass an optional setting through)."""
    if backend is None:
        yield
        return
    token = _chosen.set(check_backend(backend))
    try:
        yield
    finally:
        _chosen.reset(token)


@functools.cache
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def check_triton(device: torch.device) -> None:
    """Can a Triton kernel run on tensors of this device? Raises, saying why, when it cannot (backend='triton')."""
    if not triton_available():
        raise RuntimeError("backend='triton' needs the triton package (pip install 'probe-attn[triton]')")
    if device.type == "cuda":
        return
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return
    raise RuntimeError(
        f"backend='triton' runs on CUDA tensors, or on CPU tensors only with TRITON_INTERPRET=1 set "
        f"before triton is imported; got {device.type} tensors"
    )
