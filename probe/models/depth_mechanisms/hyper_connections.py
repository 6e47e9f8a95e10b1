"""Hyper-connections (Zhu et al., ICLR 2025, static and dynamic) and manifold-constrained hyper-connections (mHC, Xie
et al. 2025, as DeepSeek-V4 runs them) over n residual streams (docs/definitions.md#hyper-connections).

Static HC: H_pre, H_post, H_res are learned constants, initialised as Zhu et al. do so that the model is a plain
pre-norm transformer at init: sub-layer k reads stream k mod n (H_pre one-hot), every stream gets the output
(H_post = 1) and keeps itself (H_res = I). Dynamic HC adds s · tanh(RMSNorm(X_j) W) per stream j to each, W = 0 and
s = 0.01 at init. mHC computes all three from the RMS-normalised flattened streams: H_pre = σ(·) + ε, H_post = 2σ(·),
and H_res projected onto the doubly stochastic matrices by Sinkhorn-Knopp on exp of its logits.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformer_lens.hook_points import HookPoint

from probe.models.hyper import HyperConnection, register_hyper
from probe.models.layers import RMSNorm


def _weight_dtype(streams: torch.Tensor) -> torch.dtype:
    """Mixing weights are computed in at least fp32 (DeepSeek's HC modules run in fp32), fp64 stays fp64."""
    return torch.promote_types(streams.dtype, torch.float32)


@register_hyper("hc")
class StaticHyperConnection(HyperConnection):
    """Zhu et al.'s static HC: the three matrices are the parameters themselves."""

    param_roles = {"static_pre": "mixing", "static_post": "mixing", "static_res": "mixing"}

    def __init__(self, config, index: int):
        super().__init__(config, index)
        one_hot = torch.zeros(self.n)
        one_hot[index % self.n] = 1.0  # A_m: sub-layer k reads stream k mod n
        self.static_pre = nn.Parameter(one_hot)  # n
        self.static_post = nn.Parameter(torch.ones(self.n))  # n (their B)
        self.static_res = nn.Parameter(torch.eye(self.n))  # n × n, out × in (their A_r transposed)

    def weights(self, streams):
        B, T = streams.shape[:2]
        dtype = _weight_dtype(streams)
        pre, post, res = (p.to(dtype) for p in (self.static_pre, self.static_post, self.static_res))
        return pre.expand(B, T, -1), post.expand(B, T, -1), res.expand(B, T, -1, -1)


@register_hyper("hc-dynamic")
class DynamicHyperConnection(StaticHyperConnection):
    """Zhu et al.'s dynamic HC: stream j's own normalised state X̄_j adds s_α tanh(X̄_j w_pre) to its read weight,
    s_α tanh(X̄_j W_res[:, i]) to its weight in output stream i, and s_β tanh(X̄_j w_post) to its write weight."""

    param_roles = {
        **StaticHyperConnection.param_roles,
        "norm": "norm",
        "pre_proj": "mixing",
        "res_proj": "mixing",
        "post_proj": "mixing",
        "alpha_scale": "mixing",
        "beta_scale": "mixing",
    }

    def __init__(self, config, index: int):
        super().__init__(config, index)
        d = config.d_model
        self.norm = RMSNorm(d, config.norm_eps)
        self.pre_proj = nn.Parameter(torch.zeros(d))  # d: W_α's read column
        self.res_proj = nn.Parameter(torch.zeros(d, self.n))  # d × n: W_α's columns of the n output streams
        self.post_proj = nn.Parameter(torch.zeros(d))  # d: W_β
        self.alpha_scale = nn.Parameter(torch.tensor(0.01))  # s_α
        self.beta_scale = nn.Parameter(torch.tensor(0.01))  # s_β

    def weights(self, streams):
        pre, post, res = super().weights(streams)
        dtype = pre.dtype
        normed = self.norm(streams).to(dtype)  # B,T,n,d: each stream normalised on its own
        alpha, beta = self.alpha_scale.to(dtype), self.beta_scale.to(dtype)
        pre = pre + alpha * torch.tanh(normed @ self.pre_proj.to(dtype))  # B,T,n
        post = post + beta * torch.tanh(normed @ self.post_proj.to(dtype))  # B,T,n
        dyn_res = alpha * torch.tanh(normed @ self.res_proj.to(dtype))  # B,T,n_in,n_out
        return pre, post, res + dyn_res.transpose(-1, -2)  # res: out × in


def sinkhorn(logits: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """DeepSeek's Sinkhorn-Knopp on exp of ``logits`` (..., n_in, n_out), as transformers' DeepseekV4HyperConnection:
    a softmax over each input's row, + eps, then columns, then (rows, columns) iters − 1 more times, each divisor + eps.
    Returns the matrix out × in (their comb transposed): its rows, normalised last, sum to 1 up to eps."""
    comb = torch.softmax(logits, dim=-1) + eps
    return _Normalise.apply(comb, iters, eps).transpose(-1, -2)


class _Normalise(torch.autograd.Function):
    """The 2·iters − 1 alternating divisions y = x / (Σ x + eps) (columns first) with a hand-written backward: each
    step's gradient is (g − Σ g·y) / (Σ x + eps), the same derivative autograd takes of the loop, in a third of the
    operations (the mHC connection's cost is these tiny n × n steps, not their arithmetic)."""

    @staticmethod
    def forward(ctx, comb: torch.Tensor, iters: int, eps: float) -> torch.Tensor:  # ..., n_in, n_out
        dims = [-2] + [-1, -2] * (iters - 1)
        outs, divisors = [], []
        for dim in dims:
            divisor = comb.sum(dim=dim, keepdim=True) + eps
            comb = comb / divisor
            outs.append(comb)
            divisors.append(divisor)
        ctx.dims = dims
        ctx.save_for_backward(*outs, *divisors)
        return comb

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        saved = ctx.saved_tensors
        outs, divisors = saved[: len(ctx.dims)], saved[len(ctx.dims) :]
        for dim, out, divisor in zip(reversed(ctx.dims), reversed(outs), reversed(divisors)):
            grad = (grad - (grad * out).sum(dim=dim, keepdim=True)) / divisor
        return grad, None, None


def unweighted_rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / √(mean(x²) + eps) over the last axis, no gain (DeepSeek's input norm of the flattened streams)."""
    return F.rms_norm(x, (x.shape[-1],), eps=eps)


@register_hyper("mhc")
class ManifoldHyperConnection(HyperConnection):
    """mHC: [pre | post | res logits] = RMSNorm(flatten X) φ + b with one scale per part; H_pre = σ + ε, H_post = 2σ,
    H_res = Sinkhorn(res logits). φ is drawn at random, b = 0 and the scales 1 at init (DeepSeek-V4's init)."""

    param_roles = {"proj": "mixing_projection", "bias": "mixing", "scale": "mixing"}

    def __init__(self, config, index: int):
        super().__init__(config, index)
        n = self.n
        self.iters, self.eps, self.norm_eps = config.hc_sinkhorn_iters, config.hc_eps, config.norm_eps
        self.proj = nn.Parameter(torch.empty((2 + n) * n, n * config.d_model))  # φ: pre, post, res logits
        self.bias = nn.Parameter(torch.zeros((2 + n) * n))
        self.scale = nn.Parameter(torch.ones(3))  # α_pre, α_post, α_res

    @staticmethod
    def head(config) -> nn.Module:
        return ManifoldHead(config)

    def weights(self, streams):
        n, dtype = self.n, _weight_dtype(streams)
        flat = unweighted_rms(streams.flatten(2).to(dtype), self.norm_eps)  # B,T,n·d
        logits = F.linear(flat, self.proj.to(dtype))  # B,T,(2+n)n
        pre_w, post_w, res_w = logits.split([n, n, n * n], dim=-1)
        pre_b, post_b, res_b = self.bias.to(dtype).split([n, n, n * n])
        s_pre, s_post, s_res = self.scale.to(dtype).unbind(0)
        pre = torch.sigmoid(pre_w * s_pre + pre_b) + self.eps
        post = 2 * torch.sigmoid(post_w * s_post + post_b)
        res_logits = (res_w * s_res + res_b).unflatten(-1, (n, n))  # B,T,n_in,n_out (their comb's layout)
        return pre, post, sinkhorn(res_logits, self.iters, self.eps)


class ManifoldHead(nn.Module):
    """DeepSeek-V4's final collapse: Σ_j (σ(RMSNorm(flatten X) φ_j · s + b_j) + ε) X_j, fired at hook_pre."""

    param_roles = {"proj": "mixing_projection", "bias": "mixing", "scale": "mixing"}

    def __init__(self, config):
        super().__init__()
        n = config.hc_streams
        self.eps, self.norm_eps = config.hc_eps, config.norm_eps
        self.proj = nn.Parameter(torch.empty(n, n * config.d_model))
        self.bias = nn.Parameter(torch.zeros(n))
        self.scale = nn.Parameter(torch.ones(1))
        self.hook_pre = HookPoint()  # B,T,n

    def forward(self, streams: torch.Tensor) -> torch.Tensor:  # B,T,n,d -> B,T,d
        dtype = _weight_dtype(streams)
        flat = unweighted_rms(streams.flatten(2).to(dtype), self.norm_eps)
        pre = torch.sigmoid(F.linear(flat, self.proj.to(dtype)) * self.scale.to(dtype) + self.bias.to(dtype))
        pre = self.hook_pre(pre + self.eps)
        return torch.einsum("btj,btjd->btd", pre.to(streams.dtype), streams)
