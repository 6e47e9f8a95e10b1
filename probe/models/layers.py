"""Small building blocks shared by the model files: norms, rotary embedding, the MLP sub-layer."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformer_lens.hook_points import HookPoint


class RMSNorm(nn.Module):
    param_roles = {"weight": "norm"}

    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class NormPoints(nn.Module):
    """A norm's TransformerLens points (docs/definitions.md#hook-namespace), no parameters: hook_scale, the divisor
    √(mean((x − centre)²) + eps), and hook_normalized, (x − centre) / scale before the gain and bias."""

    def __init__(self):
        super().__init__()
        self.hook_scale = HookPoint()  # B,T,1
        self.hook_normalized = HookPoint()  # B,T,d
        self.materialize = False  # fire on every forward though no hook asks (probe.materialize, for nnsight)

    def watched(self) -> bool:
        return watched(self)


def watched(points) -> bool:
    """Whether a norm's points are computed on this forward: a hook asks for one, or they are materialised."""
    return points.materialize or points.hook_scale.has_hooks() or points.hook_normalized.has_hooks()


class UnembedPoints(nn.Module):
    """TransformerLens's ``unembed`` container: hook_in, what the LM head reads (B,T,d)."""

    def __init__(self):
        super().__init__()
        self.hook_in = HookPoint()  # B,T,d


def normalize(norm: nn.Module, x: torch.Tensor, points: nn.Module | None, fused) -> torch.Tensor:
    """``fused(x)``, the norm's own kernel, unless a hook watches ``points``: then the norm written out through them
    (centred for a LayerNorm, statistics in fp32 at least), so an edit of either reaches the output."""
    if points is None or not watched(points):
        return fused(x)
    wide = x.to(torch.promote_types(x.dtype, torch.float32))
    centred = wide - wide.mean(-1, keepdim=True) if isinstance(norm, nn.LayerNorm) else wide
    scale = points.hook_scale((centred.pow(2).mean(-1, keepdim=True) + norm.eps).sqrt())  # B,T,1
    out = points.hook_normalized(centred / scale)  # B,T,d
    if norm.weight is not None:
        out = out * norm.weight
    return (out if getattr(norm, "bias", None) is None else out + norm.bias).to(x.dtype)


class _Hooked:
    """What HookedRMSNorm and HookedLayerNorm share: the points they fire are their own children (a block's
    ``ln1.hook_scale``) or the ones a call hands them (the final norm's, the model's ``ln_final``). No parameters of
    their own, so checkpoints load unchanged."""

    def _own_points(self, own: bool) -> None:
        if own:
            self.hook_scale, self.hook_normalized = HookPoint(), HookPoint()  # B,T,1 and B,T,d
            self.materialize = False  # as NormPoints.materialize

    def _points(self, given: nn.Module | None) -> nn.Module | None:
        return given if given is not None else (self if hasattr(self, "hook_scale") else None)


class HookedRMSNorm(_Hooked, RMSNorm):
    def __init__(self, d: int, eps: float = 1e-6, own_points: bool = True):
        super().__init__(d, eps)
        self._own_points(own_points)

    def forward(self, x: torch.Tensor, points: nn.Module | None = None) -> torch.Tensor:
        return normalize(self, x, self._points(points), super().forward)

    def unhooked(self, x: torch.Tensor) -> torch.Tensor:
        """The norm without its points (MUDD's key and value streams through the query stream's ln1)."""
        return super().forward(x)


class HookedLayerNorm(_Hooked, nn.LayerNorm):
    def __init__(self, d: int, eps: float, bias: bool = False, own_points: bool = True):
        super().__init__(d, eps=eps, bias=bias)
        self._own_points(own_points)

    def forward(self, x: torch.Tensor, points: nn.Module | None = None) -> torch.Tensor:
        return normalize(self, x, self._points(points), super().forward)

    def unhooked(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x)


def make_norm(kind: str, d: int, eps: float, bias: bool = False, points: str | None = None) -> nn.Module:
    """An RMSNorm or LayerNorm. ``points``: None, none; "own", its own hook_scale / hook_normalized (a block's ln1
    and ln2); "given", those its forward is handed (the final norm's, named ln_final)."""
    # Wang 2026's GPT-2-style baseline is bias-free throughout, LayerNorm included (MUDDPythia's LayerNorms: bias)
    if points is None:
        return RMSNorm(d, eps) if kind == "rms" else nn.LayerNorm(d, eps=eps, bias=bias)
    own = points == "own"
    return HookedRMSNorm(d, eps, own) if kind == "rms" else HookedLayerNorm(d, eps, bias, own)


class Rotary(nn.Module):
    """RoPE (rotate-half convention) with a cos/sin table cached per (length, device, dtype). With ``d_rot`` <
    d_head only the first d_rot coordinates of each head rotate (GPT-NeoX's rotary_pct), the rest pass unchanged.

    ``table`` (config.ROPE_TABLES): "exact" fp32 cos/sin; "bfloat16" / "float16" torch.polar's fp32 table rounded to
    that dtype (MUDDFormer's / MUDDPythia's precompute_freqs_cis); "stored" the ``n_ctx`` rows of buffers ``cos`` and
    ``sin`` (n_ctx, d_rot/2), loaded with the weights (LR-AttnRes's checkpoints carry theirs)."""

    def __init__(self, d_head: int, theta: float, d_rot: int | None = None, table: str = "exact", n_ctx: int = 0):
        super().__init__()
        self.d_head, self.theta = d_rot or d_head, theta  # d_head: the rotated width
        self.partial = self.d_head < d_head
        self.table = table
        self._cache: dict = {}
        if table == "stored":
            self.register_buffer("cos", torch.ones(n_ctx, self.d_head // 2))
            self.register_buffer("sin", torch.zeros(n_ctx, self.d_head // 2))

    def tables(self, T: int, device, dtype):
        if self.table == "stored":  # read each call: load_state_dict may replace the buffers
            if T > self.cos.shape[0]:
                raise ValueError(
                    f"sequence length {T} exceeds the {self.cos.shape[0]} positions of the stored RoPE table"
                )
            return tuple(torch.cat([t[:T], t[:T]], dim=-1).to(device, dtype)[:, None, :] for t in (self.cos, self.sin))
        key = (T, str(device), dtype)
        if key not in self._cache:
            inv = 1.0 / self.theta ** (
                torch.arange(0, self.d_head, 2, device=device, dtype=torch.float32) / self.d_head
            )
            ang = torch.outer(torch.arange(T, device=device, dtype=torch.float32), inv)  # T, dh/2
            if self.table == "exact":
                ang = torch.cat([ang, ang], dim=-1)  # T, dh
                self._cache[key] = (ang.cos().to(dtype)[:, None, :], ang.sin().to(dtype)[:, None, :])  # T,1,dh
            else:
                z = torch.polar(torch.ones_like(ang), ang)
                half = getattr(torch, self.table)
                self._cache[key] = tuple(
                    torch.cat([t, t], dim=-1).to(half).to(dtype)[:, None, :] for t in (z.real, z.imag)
                )
        return self._cache[key]

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: B,T,H,dh
        if self.partial:
            rot, rest = x.split([self.d_head, x.shape[-1] - self.d_head], dim=-1)
            return torch.cat([self._rotate(rot), rest], dim=-1)
        return self._rotate(x)

    def _rotate(self, x: torch.Tensor) -> torch.Tensor:  # x: B,T,H,d_rot
        cos, sin = self.tables(x.shape[1], x.device, x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def project_with_key(x: torch.Tensor, out_proj: nn.Linear, key_proj: nn.Linear | None):
    """(out_proj(x), key_proj(x) or None): a P-LR sub-layer's output and routing key read the same input, so one
    matmul over the stacked weights does both (one GEMM forward and one for the input's gradient, not two)."""
    if key_proj is None:
        return out_proj(x), None
    y = F.linear(x, torch.cat([out_proj.weight, key_proj.weight]))  # ...,d+r
    return y.split([out_proj.out_features, key_proj.out_features], dim=-1)


class MLP(nn.Module):
    """SwiGLU or GELU feed-forward sub-layer. With `key_rank` it also emits a P-LR routing key
    from the activation passed to the output projection (LR-AttnRes 2026 Eq. 12)."""

    param_roles = {"gate": "matrix", "up": "matrix", "down": "output", "key_proj": "routing_key"}

    def __init__(self, d_model: int, d_mlp: int, kind: str, key_rank: int = 0, bias: bool = False):
        super().__init__()
        self.kind = kind
        if kind == "swiglu":
            self.gate = nn.Linear(d_model, d_mlp, bias=bias)
        self.up = nn.Linear(d_model, d_mlp, bias=bias)
        self.down = nn.Linear(d_mlp, d_model, bias=bias)
        self.key_proj = nn.Linear(d_mlp, key_rank, bias=False) if key_rank else None
        self.hook_pre = HookPoint()  # B,T,m pre-activation (SwiGLU: the gate branch)
        if kind == "swiglu":
            self.hook_pre_linear = HookPoint()  # B,T,m SwiGLU's linear (up) branch
        self.hook_post = HookPoint()  # B,T,m activation entering the output projection

    def forward(self, x: torch.Tensor):
        if self.kind == "swiglu":
            a = F.silu(self.hook_pre(self.gate(x))) * self.hook_pre_linear(self.up(x))
        else:
            a = F.gelu(self.hook_pre(self.up(x)))
        a = self.hook_post(a)  # B,T,m
        return project_with_key(a, self.down, self.key_proj)  # B,T,d and B,T,r (P-LR) or None
