"""What more than one op uses (each op's own helpers stay in its folder).

wide                  a tensor in fp32, or in its own dtype when wider: the references' precision
switched_off          an environment opt-out (PROBE_NATIVE=0, PROBE_KEEP_FREED_MEMORY=0)
first_order_only      a fused backward's decorator: create_graph=True is one line, never a wrong second derivative
check_attention_args  the shapes sink_attention and attention_row_masses take (q, k, v, sink, key bias, ...)
cpu_flash, pad_last   torch's fused CPU flash-attention op (None where this torch has none) and the zero padding
                      of head sizes to the one multiple of 8 that it needs for q, k and v alike
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

import torch
import torch.nn.functional as F

# (q, k, v (B,H,T,D), dropout, is_causal, attn_mask=, scale=) -> (out (B,H,T,D), lse (B,H,T), ...); no lse gradient
cpu_flash = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def wide_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32, or ``dtype`` when wider: the references' precision."""
    return torch.promote_types(dtype, torch.float32)


def wide(x: torch.Tensor) -> torch.Tensor:
    """x in fp32, or in its own dtype when wider: fp64 stays fp64, so fp64 checks against other code are exact."""
    return x.to(wide_dtype(x.dtype))


def switched_off(env_var: str) -> bool:
    """True where the environment sets ``env_var`` to 0 (or "false", "off", "no"): an opt-out of a default."""
    return os.environ.get(env_var, "1").strip().lower() in ("0", "false", "off", "no")


def first_order_only(backward: Callable) -> Callable:
    """Decorates a fused op's ``backward`` (a gradient written out, or a kernel's), outside ``once_differentiable``
    where it has that: under ``create_graph=True`` (grad mode on as a backward starts) its result would carry no graph,
    or a partial one, and a second derivative through it would come out wrong, or 0, without a word; one line instead,
    naming the path that has them."""

    @functools.wraps(backward)
    def checked(ctx, *grads):
        if torch.is_grad_enabled():
            raise RuntimeError(
                "this op's fused backward has no second derivative (create_graph=True); run it with "
                "backend='reference' (plain autograd) for higher-order gradients"
            )
        return backward(ctx, *grads)

    return checked


def pad_last(x: torch.Tensor, size: int) -> torch.Tensor:
    """x zero-padded on its last dim to ``size``."""
    return x if x.shape[-1] == size else F.pad(x, (0, size - x.shape[-1]))


def check_attention_args(q, k, v, sink, key_bias, window, mask=None, keep=None) -> None:
    """q (B,Tq,H,dh), k (B,Tk,Hkv,dh), v (B,Tk,Hkv,dv) with Tq <= Tk and H a multiple of Hkv; sink (H,); key_bias
    (B,Hkv,Tk); window a positive int; keep an int >= 0 with a window; mask broadcastable to (B,H,Tq,Tk)."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("expected q (B,Tq,H,dh), k (B,Tk,Hkv,dh), v (B,Tk,Hkv,dv)")
    B, Tq, H, dh = q.shape
    Tk = k.shape[1]
    if k.shape[0] != B or Tk < Tq or v.shape[:3] != k.shape[:3] or k.shape[-1] != dh:
        raise ValueError(f"shape mismatch: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if H % k.shape[2]:
        raise ValueError(f"query heads ({H}) must be a multiple of kv heads ({k.shape[2]})")
    if sink is not None and sink.shape != (H,):
        raise ValueError(f"sink must have shape ({H},), got {tuple(sink.shape)}")
    if key_bias is not None and key_bias.shape != (B, k.shape[2], Tk):
        raise ValueError(f"key_bias must have shape ({B}, {k.shape[2]}, {Tk}), got {tuple(key_bias.shape)}")
    if window is not None and (int(window) != window or window < 1):
        raise ValueError(f"window must be a positive int or None, got {window!r}")
    if keep is not None and (window is None or int(keep) != keep or keep < 0):
        raise ValueError(
            f"keep (kept first keys) must be an int >= 0 with a window, got keep={keep!r}, window={window!r}"
        )
    if mask is not None and (mask.dim() != 4 or mask.shape[-2:] != (Tq, Tk)):
        raise ValueError(f"mask must broadcast to (B, H, {Tq}, {Tk}), got {tuple(mask.shape)}")
