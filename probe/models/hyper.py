"""Hyper-connections over n residual streams (docs/definitions.md#hyper-connections): the options, the registry of the
mechanisms that weigh them (`hyper=`; static and dynamic HC and mHC in depth_mechanisms/hyper_connections.py) and the
heads that collapse the streams before the final norm.

The residual stream becomes n streams X (B,T,n,d), all equal to the embedding at the start. Around every sub-layer f
(attention, MLP) a hyper-connection computes three mixing matrices from X and does

    x_in = Σ_j H_pre[j] X_j                      (1×n: the sub-layer's read)
    X'_i = Σ_j H_res[i, j] X_j + H_post[i] f(x_in)  (n×n: stream mixing, out × in; n: the write)

A mechanism is a `HyperConnection` subclass registered with `@register_hyper(name)`: it computes (pre, post, res) in
`weights`; the module fires `hook_pre`, `hook_post` and `hook_res` on them (a hook may edit them), `hook_read` on x_in,
and mixes. The block's hook_resid_pre / mid / post are the streams' sum (`through_sum`), as on DeepSeek-V4.

For the fused boundaries (probe/models/hyper_boundary.py) a mechanism also says what its weights read of the streams
(`projection`) and how pre follows from it (`pre_rule`); it may take its weights' gradients itself instead of leaving
them to autograd: `taped_weights` (post, res and a tape from the logits), `logits_grad` (post's and res's share of the
logits' gradient) and `taped_grads` (each parameter's gradient), as dynamic HC and mHC do; `tapes(streams)`, where
defined, says where it does (mHC: where its C kernels take the tensors).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from transformer_lens.hook_points import HookPoint

from probe.hooks.fire import fire
from probe.kernels import hyper_streams
from probe.kernels.common import first_order_only
from probe.models.choice import check_choice
from probe.models.registry import registrar

HYPERS: dict[str, type[HyperConnection]] = {}


register_hyper = registrar(HYPERS, "hyper")


@dataclass
class HyperOptions:
    """ProbeConfig's hyper-connection group: the mechanism, its stream count, and mHC's Sinkhorn settings (DeepSeek's
    hc_sinkhorn_iters and hc_eps, transformers' DeepseekV4Config defaults)."""

    hyper: str = "none"  # "none" or a registered hyper-connection (HYPERS)
    hc_streams: int = 4  # n, the expansion rate (both papers' default)
    hc_sinkhorn_iters: int = 20  # mHC: Sinkhorn-Knopp rounds on H_res
    hc_eps: float = 1e-6  # mHC: added to H_pre and to exp(H_res logits), and to each Sinkhorn divisor

    def __post_init__(self) -> None:
        self.hc_streams = _whole("hc_streams", self.hc_streams)
        self.hc_sinkhorn_iters = _whole("hc_sinkhorn_iters", self.hc_sinkhorn_iters)
        self.hc_eps = _number("hc_eps", self.hc_eps)

    def check(self) -> None:
        check_choice("hyper", self.hyper, ("none", *HYPERS))
        if self.hc_streams < 1:
            raise ValueError(f"hc_streams={self.hc_streams!r} must be at least 1")
        if self.hc_sinkhorn_iters < 1:
            raise ValueError(f"hc_sinkhorn_iters={self.hc_sinkhorn_iters!r} must be at least 1")
        if self.hc_eps < 0:  # H_pre = sigmoid + eps and Sinkhorn's divisors + eps: a negative eps breaks both ranges
            raise ValueError(f"hc_eps={self.hc_eps!r} must be a finite number at least 0")


def _real(value) -> float:
    """A number as a float; NaN for a bool, a string or anything else."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan


def _number(name: str, value) -> float:
    """``value`` as a float, or one ValueError line naming the option (a bool, a string, NaN or infinity)."""
    if not math.isfinite(number := _real(value)):
        raise ValueError(f"{name}={value!r} must be a finite number")
    return number


def _whole(name: str, value) -> int:
    """``value`` as an int, or one ValueError line naming the option (not a whole number: 2.7, "two")."""
    if not math.isfinite(number := _real(value)) or number != int(number):
        raise ValueError(f"{name}={value!r} must be a whole number")
    return int(number)


class HyperConnection(nn.Module):
    """The hyper-connection around one sub-layer (``index`` k = 2l for block l's attention, 2l + 1 for its MLP).

    ``weights(streams)`` returns pre (B,T,n), post (B,T,n) and res (B,T,n,n, out × in), at least fp32;
    ``param_roles`` declares its parameters (params.py); ``head(config)`` is the module that collapses the streams
    before the final norm (the stream sum unless the mechanism has its own)."""

    param_roles: dict[str, str] = {}

    def __init__(self, config, index: int):  # every hyper-connection is built as HYPERS[name](config, index)
        super().__init__()
        self.n, self.index = config.hc_streams, index
        self.hook_pre = HookPoint()  # B,T,n read weights
        self.hook_post = HookPoint()  # B,T,n write weights
        self.hook_res = HookPoint()  # B,T,n,n stream mixing, out × in
        self.hook_read = HookPoint()  # B,T,d the sub-layer's input Σ_j H_pre[j] X_j

    @staticmethod
    def head(config) -> nn.Module:
        return StreamSum(config.hc_streams)

    def projection(self, dtype: torch.dtype) -> tuple[torch.Tensor, int, float] | None:
        """What the weights read of the streams, if anything: (W (L, k), groups, eps), the logits RMSNorm(X_g) W of
        each of the streams' ``groups`` groups of L = n·d / groups values (no gain: a gain is folded into W), computed
        from the parameters in ``dtype``. None: the weights are the parameters alone (static HC)."""
        return None

    def weights_from_logits(self, logits: torch.Tensor | None, lead, dtype: torch.dtype):
        """(pre (B,T,n), post (B,T,n), res (B,T,n,n, out × in)) in ``dtype`` from the logits (B,T,groups,k) of
        ``projection`` (None where it is None); ``lead`` is (B, T)."""
        raise NotImplementedError

    def pre_rule(self, dtype: torch.dtype) -> tuple | None:
        """How pre follows from the logits, for the fused boundaries' kernel (probe.models.hyper_boundary), which
        reads with it while the new streams sit in cache: (1, a, b, eps, step), pre_j = σ(a z_j + b_j) + eps, or
        (2, a, b, 0, step), pre_j = b_j + a tanh(z_j), z_j the (j·step)-th of a token's groups × k logits; a a float,
        b (n,) in ``dtype``. A mechanism with a ``projection`` gives one (weights_from_logits computes the same pre)."""
        return None

    def weights(self, streams: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return weights(self, streams)

    def read(self, streams: torch.Tensor):
        """The sub-layer's input (B,T,d) from the streams (B,T,n,d), and the (post, res) its ``write`` needs."""
        pre, post, res = self.weights(streams)
        pre, post, res = self.hook_pre(pre), self.hook_post(post), self.hook_res(res)
        return self.hook_read(read_streams(pre.to(streams.dtype), streams)), (post, res)

    @staticmethod
    def write(streams: torch.Tensor, out: torch.Tensor, mix) -> torch.Tensor:
        """X' = H_res X + H_post ⊗ f(x_in): streams (B,T,n,d), the sub-layer's output (B,T,d) -> (B,T,n,d)."""
        post, res = mix
        return _Write.apply(streams, out, post.to(out.dtype), res.to(streams.dtype))


def weight_dtype(streams: torch.Tensor) -> torch.dtype:
    """Mixing weights are computed in at least fp32 (DeepSeek's HC modules run in fp32), fp64 stays fp64."""
    return torch.promote_types(streams.dtype, torch.float32)


def weights(module, streams: torch.Tensor):
    """``module``'s (pre, post, res) of the streams (B,T,n,d): its ``projection`` of them, if any, through its
    ``weights_from_logits`` (a hyper-connection, or a head, whose post and res are None)."""
    dtype, lead = weight_dtype(streams), streams.shape[:2]
    logits = None
    if (spec := module.projection(dtype)) is not None:
        proj, groups, eps = spec
        logits = normed_projection(streams.reshape(*lead, groups, -1).to(dtype), proj, eps)  # B,T,groups,k
    return module.weights_from_logits(logits, lead, dtype)


def normed_projection(x: torch.Tensor, proj: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm(x) W with no gain (a gain is folded into W by the caller): (..., d) @ (d, k) -> (..., k), computed as
    (x W) / rms(x), rms(x) = √(mean(x²) + eps), so the divisor acts on k outputs and no normalised copy of x exists."""
    return _NormedProjection.apply(x, proj, eps)


class _NormedProjection(torch.autograd.Function):
    """(x W) · r, r = 1 / rms(x), with a hand-written backward: G r Wᵀ + x c with c = −(Σ_k G·xW) r³ / d (r's
    derivative), one product and one fused multiply-add over x where autograd takes five passes over it."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, proj: torch.Tensor, eps: float) -> torch.Tensor:  # ..., d; d, k
        inv_rms = torch.rsqrt(torch.linalg.vector_norm(x, dim=-1, keepdim=True).square() / x.shape[-1] + eps)
        projected = torch.matmul(x, proj)  # ..., k
        ctx.save_for_backward(x, proj, projected, inv_rms)
        return projected * inv_rms

    @staticmethod
    @first_order_only
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):  # ..., k
        x, proj, projected, inv_rms = ctx.saved_tensors
        d, k = proj.shape
        grad_projected = grad * inv_rms  # ..., k
        grad_x = grad_proj = None
        if ctx.needs_input_grad[0]:
            coeff = (grad * projected).sum(-1, keepdim=True) * inv_rms.pow(3) / -d  # ..., 1
            grad_x = torch.matmul(grad_projected, proj.T).addcmul_(x, coeff.expand_as(x))  # ..., d
        if ctx.needs_input_grad[1]:
            grad_proj = x.reshape(-1, d).T @ grad_projected.reshape(-1, k)  # d, k
        return grad_x, grad_proj, None


def read_streams(weights: torch.Tensor, streams: torch.Tensor) -> torch.Tensor:
    """Σ_j w[j] X_j: weights (B,T,n), streams (B,T,n,d) -> (B,T,d) (a read, or a head's collapse)."""
    return _ReadStreams.apply(weights, streams)


class _ReadStreams(torch.autograd.Function):
    """Σ_j w[j] X_j as a (1 × n)(n × d) product per token, with a hand-written backward: the streams' gradient w ⊗ G
    as a broadcast product (autograd's batched product of inner size 1 is about 4x slower on CPU)."""

    @staticmethod
    def forward(ctx, weights: torch.Tensor, streams: torch.Tensor) -> torch.Tensor:  # B,T,n; B,T,n,d
        weights = weights.contiguous()  # static HC's and the stream sum's are expanded: see _Write
        ctx.save_for_backward(weights, streams)
        read = hyper_streams.read_forward(weights, streams)  # C on CPU (probe.kernels.hyper_streams), else None
        return read if read is not None else torch.matmul(weights.unsqueeze(-2), streams).squeeze(-2)

    @staticmethod
    @first_order_only
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):  # B,T,d
        weights, streams = ctx.saved_tensors
        need_weights, need_streams = ctx.needs_input_grad
        grads = hyper_streams.read_backward(weights, streams, grad, need_weights, need_streams)
        if grads is not None:
            return grads
        grad_weights = torch.matmul(grad.unsqueeze(-2), streams.transpose(-1, -2)).squeeze(-2) if need_weights else None
        grad_streams = weights.unsqueeze(-1) * grad.unsqueeze(-2) if need_streams else None
        return grad_weights, grad_streams


class _Write(torch.autograd.Function):
    """X' = H_res X + H_post ⊗ f as a batched product and a fused multiply-add into its buffer, with a hand-written
    backward of four products: the connection's cost is passes over the (B,T,n,d) streams, and autograd's mix, outer
    product and sum take three forward and about seven backward; these take two and four. On CPU under the default
    backend both directions are one C pass each (probe.kernels.hyper_streams)."""

    @staticmethod
    def forward(ctx, streams, out, post, res):  # B,T,n,d; B,T,d; B,T,n; B,T,n,n (out × in)
        # small (B,T,n[,n]) weights in row-major order: a batched product over a permuted view (Sinkhorn's) or an
        # expanded one (static HC's) falls back to a loop over the B·T matrices
        post, res = post.contiguous(), res.contiguous()
        ctx.save_for_backward(streams, out, post, res)
        new = hyper_streams.write_forward(streams, out, post, res)  # C on CPU, else None
        if new is not None:
            return new
        new = torch.matmul(res, streams)  # B,T,n,d
        return new.addcmul_(post.unsqueeze(-1), out.unsqueeze(-2))  # += H_post ⊗ f

    @staticmethod
    @first_order_only
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):  # B,T,n,d
        streams, out, post, res = ctx.saved_tensors
        need_streams, need_out, need_post, need_res = ctx.needs_input_grad
        grads = hyper_streams.write_backward(grad, streams, out, post, res, ctx.needs_input_grad)
        if grads is not None:
            return grads
        grad_streams = torch.matmul(res.transpose(-1, -2), grad) if need_streams else None  # H_resᵀ G
        grad_out = torch.matmul(post.unsqueeze(-2), grad).squeeze(-2) if need_out else None  # Σ_i H_post[i] G_i
        # G_i · f as f (1 × d) times Gᵀ: the (n × d)(d × 1) orientation is about 2x slower on CPU
        grad_post = torch.matmul(out.unsqueeze(-2), grad.transpose(-1, -2)).squeeze(-2) if need_post else None
        grad_res = torch.matmul(grad, streams.transpose(-1, -2)) if need_res else None  # G Xᵀ
        return grad_streams, grad_out, grad_post, grad_res


class StreamSum(nn.Module):
    """The streams' sum, as Zhu et al. end the network (lucidrains' reduce): pre = 1 per stream, fired at hook_pre."""

    def __init__(self, n: int):
        super().__init__()
        self.n = n
        self.hook_pre = HookPoint()  # B,T,n

    def projection(self, dtype):
        return None

    def weights_from_logits(self, logits, lead, dtype):
        return torch.ones(*lead, self.n, dtype=dtype), None, None

    def forward(self, streams: torch.Tensor) -> torch.Tensor:  # B,T,n,d -> B,T,d
        pre = self.hook_pre(streams.new_ones(streams.shape[:3]))
        return read_streams(pre, streams)


def through_sum(point: HookPoint, streams: torch.Tensor, lazy: bool = False) -> torch.Tensor:
    """The streams' sum (B,T,d) through ``point`` (hook_resid_pre / mid / post of a stream model); an edit's change is
    added, divided by n, to every stream (B,T,n,d), so the sum moves by exactly the edit. ``lazy``: only when a hook
    asks (probe's blocks, unless probe.materialize is on): nothing else reads the sum, a pass over the streams."""
    if lazy and not point.has_hooks():
        return streams
    fired, edited = fire(point, streams.sum(dim=-2))
    if not edited:
        return streams
    # the sum again: the hook may have written into the one it was given
    return streams + ((fired - streams.sum(dim=-2)) / streams.shape[-2]).unsqueeze(-2)


def make_hyper(config, index: int) -> HyperConnection:
    return HYPERS[config.hyper](config, index)


def expand(x: torch.Tensor, n: int) -> torch.Tensor:
    """The n streams the blocks start from: the embedding (B,T,d) copied into each, B,T,n,d."""
    return x.unsqueeze(2).expand(-1, -1, n, -1).contiguous()
