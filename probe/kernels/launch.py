"""Launch settings that fit the device: one pure function (op, shapes, dtypes, device limits) -> launch configuration.

    limits = device_limits(q.device)            # the driver's opt-in shared memory per block, read at run time
    cfg = launch_config("sink_forward", q.dtype, limits, dh=64, dv=64)
    kernel[grid](..., **cfg.constexprs(), **cfg.options())      # None: nothing fits -> the op's torch path

Each op has candidate settings in order of preference (the first is the one the kernels were written for: 64 x 64
tiles, 4 warps, 3 stages); the first whose estimated shared memory fits ``limits.shared_bytes`` is chosen. The
estimate counts what Triton keeps in shared memory for these kernels: every tile that feeds a ``tl.dot`` (operands
are staged through shared memory), the tiles loaded inside the key / query loop once per pipeline buffer (num_stages
- 1 buffers on sm_80-89; num_stages on sm_90's wgmma path, taken by 16-bit dots of 64+ rows on 4k warps), the
layout-conversion scratch of a (rows x keys) probability tile and the row reductions' scratch. It is an upper bound
checked against the compiled kernels' ``metadata.shared`` for every listed shape on sm_80/86/89/90
(tests/kernels/test_aot_compile.py), so a config that the function accepts compiles within the limit on those GPUs.

``use_device_limits(ARCHS["sm_86"])`` makes the launchers choose as on another device (tests, ahead-of-time
compiles); on CPU under TRITON_INTERPRET=1 the limits are ``INTERPRETER``: no shared memory, small tiles (the
interpreter's cost grows with the tile, not the launch count).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import warnings

import torch

KB = 1024


@dataclasses.dataclass(frozen=True)
class DeviceLimits:
    name: str  # "sm_86", a device name, or "interpreter"
    capability: int | None  # major * 10 + minor (None: the interpreter)
    shared_bytes: int | None  # opt-in shared memory per block (None: the interpreter, no limit)


ARCHS = {
    "sm_80": DeviceLimits("sm_80", 80, 163 * KB),  # A100
    "sm_86": DeviceLimits("sm_86", 86, 99 * KB),  # RTX 30, A10, A40
    "sm_89": DeviceLimits("sm_89", 89, 99 * KB),  # RTX 40, L4
    "sm_90": DeviceLimits("sm_90", 90, 227 * KB),  # H100, H200
}
INTERPRETER = DeviceLimits("interpreter", None, None)


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
    """Sink-attention kernels (forward, both backward kernels; the row masses run the forward)."""

    block_m: int  # query rows per program
    block_n: int  # keys per program (backward dK/dV) or per loop step
    block_dh: int
    block_dv: int
    num_warps: int
    num_stages: int
    shared_bytes: int  # the estimate (0 under the interpreter)

    def constexprs(self) -> dict:
        return dict(BLOCK_M=self.block_m, BLOCK_N=self.block_n, BLOCK_DH=self.block_dh, BLOCK_DV=self.block_dv)

    def options(self) -> dict:
        return dict(num_warps=self.num_warps, num_stages=self.num_stages)


@dataclasses.dataclass(frozen=True)
class DepthConfig:
    """Depth-attention kernels: rows (B*T) per program, the d slice, the whole key width r."""

    block_t: int
    block_d: int
    block_r: int
    num_warps: int
    num_stages: int
    shared_bytes: int

    def constexprs(self) -> dict:
        return dict(BLOCK_T=self.block_t, BLOCK_D=self.block_d, BLOCK_R=self.block_r)

    def options(self) -> dict:
        return dict(num_warps=self.num_warps, num_stages=self.num_stages)


ATTENTION_OPS = ("sink_forward", "sink_backward_dkdv", "sink_backward_dq")
RULE_OPS = ("rule_forward", "rule_backward_dkdv", "rule_backward_dq")  # probe.kernels.rule_triton: the same tiles
DEPTH_OPS = ("depth_forward", "depth_backward")
OPS = ATTENTION_OPS + RULE_OPS + DEPTH_OPS

# (block_m, block_n, num_warps, num_stages), most preferred first; tl.dot needs 16+ on each side
ATTENTION_CANDIDATES = (
    (64, 64, 4, 3),
    (64, 64, 4, 2),
    (64, 32, 4, 2),
    (32, 64, 4, 2),
    (32, 32, 4, 2),
    (32, 32, 4, 1),
    (16, 32, 2, 1),
    (16, 16, 2, 1),
)
_INTERPRETER_ATTENTION = (16, 16, 4, 1)
# depth: rows per program as the key width allows (a (rows, r) fp32 key tile stays in registers), the d slice
DEPTH_MAX_BLOCK_D = 128
DEPTH_KEY_ELEMENTS = 8192  # rows * r per program
DEPTH_CANDIDATES = ((4, 3), (4, 1))  # (num_warps, num_stages): Triton's defaults first, then no pipelining


def _next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _size(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def _wgmma(limits: DeviceLimits, dtype: torch.dtype, block_m: int, num_warps: int) -> bool:
    """sm_90's asynchronous MMA: 16-bit operands, 64+ rows, a multiple of 4 warps; its operands stay in shared
    memory for all num_stages buffers."""
    return (
        (limits.capability or 0) >= 90
        and dtype in (torch.bfloat16, torch.float16)
        and block_m >= 64
        and num_warps % 4 == 0
    )


def attention_shared_bytes(
    op: str,
    dtype: torch.dtype,
    limits: DeviceLimits,
    block_m: int,
    block_n: int,
    block_dh: int,
    block_dv: int,
    num_warps: int,
    num_stages: int,
    v_dtype: torch.dtype | None = None,
) -> int:
    """Estimated shared memory (bytes) of one sink-attention or row-rule launch; an upper bound (see the module
    docstring). A row-rule launch loads the tiles of its sink-attention twin, and in the dK/dV loop two more fp32 rows
    (softpick's eps / D and shift key); its forward's softpick step reduces the tile once more (max and argmax)."""
    rule = op in RULE_OPS
    op = op.replace("rule_", "sink_") if rule else op
    es, ev = _size(dtype), _size(v_dtype or dtype)
    wg = _wgmma(limits, dtype, block_m if op != "sink_backward_dkdv" else block_n, num_warps)
    buffers = num_stages if wg else max(1, num_stages - 1)
    p_bytes = 4 if torch.float32 in (dtype, v_dtype or dtype) else 2  # the probability tile, as its dot reads it
    scratch = block_m * block_n * p_bytes
    if op == "sink_forward":  # q once; k, v and the key bias per key block
        once = block_m * block_dh * es
        loop = block_n * block_dh * es + block_n * block_dv * ev + block_n * 4
    elif op == "sink_backward_dkdv":  # k, v once; q, dO, lse and delta per query block; ds^T and p^T converted
        once = block_n * block_dh * es + block_n * block_dv * es
        loop = block_m * block_dh * es + block_m * block_dv * es + (4 if rule else 2) * block_m * 4
        scratch *= 2
    elif op == "sink_backward_dq":  # q, dO once; k, v and the key bias per key block
        once = block_m * block_dh * es + block_m * block_dv * es
        loop = block_n * block_dh * es + block_n * block_dv * es + block_n * 4
    else:
        raise ValueError(f"unknown op {op!r}; choose one of {', '.join(ATTENTION_OPS)}")
    rows = (4 if rule else 2) * max(block_m, block_n) * 4  # cross-warp scratch of the fp32 row reductions
    return once + buffers * loop + scratch + rows


def depth_shared_bytes(
    op: str,
    dtype: torch.dtype,
    limits: DeviceLimits,
    block_t: int,
    block_d: int,
    block_r: int,
    num_warps: int,
    num_stages: int,
) -> int:
    """Estimated shared memory of one depth launch: no dots, so only the cross-warp reduction scratch of the row
    sums (the r-wide score, the d-wide dalpha), fp32, one value per row and warp."""
    if op not in DEPTH_OPS:
        raise ValueError(f"unknown op {op!r}; choose one of {', '.join(DEPTH_OPS)}")
    return 4 * block_t * num_warps * 32 // max(1, min(num_warps * 32, block_t)) + 4 * block_t * max(block_r, block_d)


def launch_config(
    op: str,
    dtype: torch.dtype,
    limits: DeviceLimits,
    *,
    dh: int = 0,
    dv: int = 0,
    v_dtype: torch.dtype | None = None,
    d: int = 0,
    r: int = 0,
):
    """The launch settings of ``op`` for these sizes and dtypes on a device with ``limits``; None when nothing fits.

    Attention ops take the head dims dh / dv (v_dtype: the values' dtype when it differs, as in the row masses,
    whose fp32 indicators ride as the values); depth ops the width d and key width r.
    """
    if op in DEPTH_OPS:
        block_r = _next_pow2(r)  # no dots here: no 16 minimum
        block_d = min(_next_pow2(d), 16 if limits.shared_bytes is None else DEPTH_MAX_BLOCK_D)
        block_t = 16 if limits.shared_bytes is None else max(1, min(64, DEPTH_KEY_ELEMENTS // block_r))
        for warps, stages in DEPTH_CANDIDATES:
            est = depth_shared_bytes(op, dtype, limits, block_t, block_d, block_r, warps, stages)
            if limits.shared_bytes is None or est <= limits.shared_bytes:
                return DepthConfig(block_t, block_d, block_r, warps, stages, 0 if limits.shared_bytes is None else est)
        return None
    if op not in ATTENTION_OPS + RULE_OPS:
        raise ValueError(f"unknown op {op!r}; choose one of {', '.join(OPS)}")
    block_dh, block_dv = max(16, _next_pow2(dh)), max(16, _next_pow2(dv))
    if limits.shared_bytes is None:
        bm, bn, warps, stages = _INTERPRETER_ATTENTION
        return AttentionConfig(bm, bn, block_dh, block_dv, warps, stages, 0)
    for bm, bn, warps, stages in ATTENTION_CANDIDATES:
        est = attention_shared_bytes(op, dtype, limits, bm, bn, block_dh, block_dv, warps, stages, v_dtype)
        if est <= limits.shared_bytes:
            return AttentionConfig(bm, bn, block_dh, block_dv, warps, stages, est)
    return None


# ---------------------------------------------------------------- the device's limits, read at run time

_limits_override: contextvars.ContextVar[DeviceLimits | None] = contextvars.ContextVar(
    "probe_device_limits", default=None
)


@contextlib.contextmanager
def use_device_limits(limits: DeviceLimits | None):
    """Inside the block the launchers choose for ``limits`` instead of the device's own (None: the device's)."""
    token = _limits_override.set(limits)
    try:
        yield
    finally:
        _limits_override.reset(token)


@functools.cache
def _cuda_limits(index: int) -> DeviceLimits:
    props = torch.cuda.get_device_properties(index)
    shared = getattr(props, "shared_memory_per_block_optin", 0) or getattr(props, "shared_memory_per_block", 0)
    return DeviceLimits(props.name, props.major * 10 + props.minor, int(shared))


def device_limits(device: torch.device) -> DeviceLimits:
    """The limits launches on ``device`` must fit: ``use_device_limits``'s, else the CUDA driver's, else the
    interpreter's (CPU tensors under TRITON_INTERPRET=1)."""
    override = _limits_override.get()
    if override is not None:
        return override
    device = torch.device(device)
    if device.type == "cuda":
        return _cuda_limits(device.index if device.index is not None else torch.cuda.current_device())
    return INTERPRETER


class NoLaunchConfig(RuntimeError):
    """No launch setting of a Triton kernel fits the device: the dispatch takes the op's torch path instead."""


_fallbacks_warned: set[str] = set()


def warn_fallback(error: NoLaunchConfig, path: str) -> None:
    """One warning per distinct shape that takes the torch ``path`` because no Triton launch fits the device."""
    message = f"{error}; using the {path} path instead"
    if message not in _fallbacks_warned:
        _fallbacks_warned.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)
