"""Value-side transforms of the attention variants (abstention-filtering §3.3, gatedv.md).

Every transform is computed in fp32 and the transformed value is returned in the input dtype. Per-key scalar gates
(norm, proj, routing-norm) are returned as (B, T, Hkv); element-wise gates (silu, tanh) as (B, T, Hkv, dv).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

TRANSFORMS = ("identity", "silu", "tanh", "norm", "proj", "routing-norm")


def check_transform(kind: str, tau=None, w=None, b=None) -> None:
    if kind not in TRANSFORMS:
        raise ValueError(f"unknown value transform {kind!r}; valid kinds: {', '.join(TRANSFORMS)}")
    if kind in ("norm", "routing-norm") and tau is None:
        raise ValueError(f"transform {kind!r} needs tau of shape (Hkv,)")
    if kind == "proj" and (w is None or b is None):
        raise ValueError("transform 'proj' needs w of shape (Hkv, dv) and b of shape (Hkv,)")


def gate_logit(v: torch.Tensor, kind: str, *, tau=None, w=None, b=None, beta: float = 8.0) -> torch.Tensor:
    """Pre-sigmoid logit z of a per-key scalar gate g = sigmoid(z), fp32, (B, T, Hkv)."""
    v = v.float()  # (B, T, Hkv, dv)
    if kind in ("norm", "routing-norm"):
        rms = v.norm(dim=-1) / math.sqrt(v.shape[-1])  # (B, T, Hkv)  ||v|| / sqrt(dv)
        return beta * (rms - tau.float())
    if kind == "proj":
        return (v * w.float()).sum(-1) + b.float()  # (B, T, Hkv)  w_h . v + b_h
    raise ValueError(f"transform {kind!r} has no scalar gate")


def value_transform(v: torch.Tensor, kind: str, *, tau=None, w=None, b=None, beta: float = 8.0):
    """Apply a value transform; returns (v_out in v.dtype, gate or None).

    identity      v                         gate None
    silu          v * sigmoid(v)            gate sigmoid(v)   (B, T, Hkv, dv)   GatedV
    tanh          v * tanh(v)               gate tanh(v)      (B, T, Hkv, dv)
    norm          sigmoid(beta (||v||/sqrt(dv) - tau_h)) * v   gate (B, T, Hkv)
    proj          sigmoid(w_h . v + b_h) * v                   gate (B, T, Hkv)
    routing-norm  v unchanged; the norm gate is returned and belongs in the logits as + log g
    """
    check_transform(kind, tau, w, b)
    if kind == "identity":
        return v, None
    vf = v.float()  # (B, T, Hkv, dv)
    if kind == "silu":
        gate = torch.sigmoid(vf)
        return (vf * gate).to(v.dtype), gate
    if kind == "tanh":
        gate = torch.tanh(vf)
        return (vf * gate).to(v.dtype), gate
    gate = torch.sigmoid(gate_logit(vf, kind, tau=tau, w=w, b=b, beta=beta))  # (B, T, Hkv)
    if kind == "routing-norm":
        return v, gate
    return (vf * gate[..., None]).to(v.dtype), gate


def apply_transform(v: torch.Tensor, kind: str, key_bias=None, *, tau=None, w=None, b=None, beta: float = 8.0):
    """What attention needs from a transform: the values to aggregate and the extra per-key logit (B, Hkv, T) or None.

    For routing-norm the extra logit is log g_j = logsigmoid(z_j) (finite even where g underflows), added to key_bias.
    """
    if kind == "routing-norm":
        check_transform(kind, tau, w, b)
        log_g = F.logsigmoid(gate_logit(v, kind, tau=tau, beta=beta)).transpose(1, 2)  # (B, Hkv, T)
        key_bias = log_g if key_bias is None else key_bias.float() + log_g
        return v, key_bias
    v_out, _ = value_transform(v, kind, tau=tau, w=w, b=b, beta=beta)
    return v_out, None if key_bias is None else key_bias.float()
