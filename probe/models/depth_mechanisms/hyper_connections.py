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
from transformer_lens.hook_points import HookPoint

from probe.kernels import hyper_streams
from probe.kernels.common import first_order_only
from probe.models.hyper import HyperConnection, read_streams, register_hyper, weights
from probe.models.layers import RMSNorm


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

    def weights_from_logits(self, logits, lead, dtype):
        B, T = lead
        pre, post, res = (p.to(dtype) for p in (self.static_pre, self.static_post, self.static_res))
        # copies, not expanded views: a hook that edits them in place edits this forward's weights, not the
        # parameters (the write's and the read's products make them contiguous anyway)
        return pre.expand(B, T, -1).clone(), post.expand(B, T, -1).clone(), res.expand(B, T, -1, -1).clone()

    def summed_grads(self, grad_pre, grad_post, grad_res) -> dict:
        """Each parameter's gradient from its per-token weight's (B,T,n), (B,T,n), (B,T,n,n): the sum over tokens
        (the fused boundaries' shortcut past autograd for weights that are the parameters themselves)."""
        grads = (grad_pre, grad_post, grad_res)
        params = (self.static_pre, self.static_post, self.static_res)
        return {p: g.sum((0, 1)).to(p.dtype) for p, g in zip(params, grads, strict=True) if g is not None}


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
        self.norm = RMSNorm(d, config.norm_eps)  # its gain and eps; weights() folds the norm into the projections
        self.pre_proj = nn.Parameter(torch.zeros(d))  # d: W_α's read column
        self.res_proj = nn.Parameter(torch.zeros(d, self.n))  # d × n: W_α's columns of the n output streams
        self.post_proj = nn.Parameter(torch.zeros(d))  # d: W_β
        self.alpha_scale = nn.Parameter(torch.tensor(0.01))  # s_α
        self.beta_scale = nn.Parameter(torch.tensor(0.01))  # s_β

    def projection(self, dtype):
        # RMSNorm(X_j) W = (X_j (γ ⊙ W)) / rms(X_j): the gain folded into the three projections, done as one product,
        # and the divisor applied to their 2 + n outputs instead of the d inputs (no normalised copy of the streams)
        proj = self._unfolded().to(dtype)  # d, 2+n
        return proj * self.norm.weight.to(dtype)[:, None], self.n, self.norm.eps  # one group per stream

    def _unfolded(self) -> torch.Tensor:  # d, 2+n: W = [pre_proj | post_proj | res_proj], before the norm's gain
        return torch.cat([self.pre_proj[:, None], self.post_proj[:, None], self.res_proj], dim=1)

    def pre_rule(self, dtype):  # pre_j = static_pre_j + s_α tanh(z_j), z_j stream j's first logit
        return 2, self.alpha_scale.item(), self.static_pre.detach().to(dtype).contiguous(), 0.0, 2 + self.n

    def weights_from_logits(self, logits, lead, dtype):  # logits: B,T,n_in,2+n
        pre, post, res = super().weights_from_logits(None, lead, dtype)
        dyn_pre, dyn_post, dyn_res = torch.tanh(logits).split([1, 1, self.n], dim=-1)
        alpha, beta = self.alpha_scale.to(dtype), self.beta_scale.to(dtype)
        pre = pre + alpha * dyn_pre.squeeze(-1)  # B,T,n
        post = post + beta * dyn_post.squeeze(-1)  # B,T,n
        return pre, post, res + (alpha * dyn_res).transpose(-1, -2)  # res: out × in

    # The fused boundaries' shortcut past autograd (probe.models.hyper_boundary): post and res from the logits with
    # no graph, and every gradient of the weights taken by hand from their tanh (the tape), in fewer tensor ops than
    # autograd's two passes over the weights' graph (docs/results/benchmarks.md: +0.008 of the baseline's throughput)

    def taped_weights(self, logits, dtype):
        """(post (B,T,n), res (B,T,n,n), the tape: tanh of the logits (B,T,n_in,2+n)), as weights_from_logits."""
        tanh = torch.tanh(logits)
        post = torch.add(self.static_post.detach().to(dtype), tanh[..., 1], alpha=self.beta_scale.item())
        res = torch.add(
            self.static_res.detach().to(dtype), tanh[..., 2:].transpose(-1, -2), alpha=self.alpha_scale.item()
        )
        return post, res, tanh

    def logits_grad(self, tanh, grad_post, grad_res):
        """post's and res's share of the logits' gradient (B,T,n_in,2+n; pre's column 0) from theirs (None: none)."""
        zero = tanh.new_zeros(()).expand(tanh.shape[:-1])
        grad_post = zero if grad_post is None else grad_post * self.beta_scale.item()  # B,T,n
        grad_res = zero.unsqueeze(-1).expand(*zero.shape, self.n) if grad_res is None else grad_res.transpose(-1, -2)
        grad = torch.cat([zero.unsqueeze(-1), grad_post.unsqueeze(-1), grad_res * self.alpha_scale.item()], dim=-1)
        return grad.mul_(1 - tanh * tanh)  # tanh' at the logits

    def taped_grads(self, tanh, grad_pre, grad_post, grad_res, grad_proj) -> dict:
        """Each trainable parameter's gradient from the weights' (B,T,n), (B,T,n), (B,T,n,n) (None: none) and the
        folded projection's (d, 2+n) (``projection``: W γ, W = [pre_proj | post_proj | res_proj])."""
        gamma = self.norm.weight.detach().to(grad_proj.dtype)
        unfolded = grad_proj * gamma[:, None]  # d, 2+n: W's gradient
        found = {
            self.static_pre: grad_pre.sum((0, 1)),
            self.alpha_scale: torch.dot(grad_pre.reshape(-1), tanh[..., 0].reshape(-1)),
            self.pre_proj: unfolded[:, 0],
            self.post_proj: unfolded[:, 1],
            self.res_proj: unfolded[:, 2:],
        }
        if grad_post is not None:
            found[self.static_post] = grad_post.sum((0, 1))
            found[self.beta_scale] = torch.dot(grad_post.reshape(-1), tanh[..., 1].reshape(-1))
        if grad_res is not None:  # out × in; the tape's res columns are in × out
            found[self.static_res] = grad_res.sum((0, 1))
            found[self.alpha_scale] = found[self.alpha_scale] + (grad_res.transpose(-1, -2) * tanh[..., 2:]).sum()
        if self.norm.weight.requires_grad:
            found[self.norm.weight] = (grad_proj * self._unfolded().detach().to(grad_proj.dtype)).sum(1)
        return {p: g.to(p.dtype) for p, g in found.items() if p.requires_grad}


def sinkhorn(logits: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """DeepSeek's Sinkhorn-Knopp on exp of ``logits`` (..., n_in, n_out), as transformers' DeepseekV4HyperConnection:
    a softmax over each input's row, + eps, then columns, then (rows, columns) iters − 1 more times, each divisor + eps.
    Returns the matrix out × in (their comb transposed): its rows, normalised last, sum to 1 up to eps.

    The steps run on the entries laid out (n_in, n_out, M), M = the leading axes flattened: each sum over n is then a
    sum of n contiguous length-M vectors, not M strided sums of n, about 5x faster at (B,T,4,4) on CPU."""
    lead, (n_in, n_out) = logits.shape[:-2], logits.shape[-2:]
    if n_in == n_out and hyper_streams.takes_sinkhorn(logits.contiguous(), iters):  # each token's steps in C
        return _SinkhornInC.apply(logits.contiguous(), iters, eps)
    # n_in, n_out, M, contiguous: the softmax over a strided view takes ~50x longer
    by_entry = logits.reshape(-1, n_in, n_out).permute(1, 2, 0).contiguous()
    comb = _Normalise.apply(torch.softmax(by_entry, dim=1) + eps, iters, eps)  # n_in, n_out, M
    return comb.permute(2, 1, 0).reshape(*lead, n_out, n_in).contiguous()  # row-major for the batched products


class _SinkhornInC(torch.autograd.Function):
    """Sinkhorn in C (probe.kernels.hyper_streams: CPU, default backend) as an autograd node; the backward recomputes
    each token's steps from the logits, which is all it keeps."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
        ctx.iters, ctx.eps = iters, eps
        ctx.save_for_backward(logits)
        return hyper_streams.sinkhorn_forward(logits, iters, eps)

    @staticmethod
    @first_order_only
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        (logits,) = ctx.saved_tensors
        return hyper_streams.sinkhorn_backward(logits, grad, ctx.iters, ctx.eps), None, None


class _Normalise(torch.autograd.Function):
    """The 2·iters − 1 alternating divisions y = x / (Σ x + eps) (columns first) of the entries (n_in, n_out, M) with a
    hand-written backward: each step's gradient is (g − Σ g·y) / (Σ x + eps), the same derivative autograd takes of
    the loop, in a third of the operations (the mHC connection's cost is these tiny n × n steps, not their
    arithmetic)."""

    @staticmethod
    def forward(ctx, comb: torch.Tensor, iters: int, eps: float) -> torch.Tensor:  # n_in, n_out, M
        dims = [0] + [1, 0] * (iters - 1)  # 0: a column's sum over its inputs, 1: a row's over its outputs
        outs, divisors = [], []
        eps_value = comb.new_tensor(eps)  # a 0-dim tensor: a Python float is converted on every add, ~4x its cost
        for dim in dims:
            divisor = comb.sum(dim=dim, keepdim=True).add_(eps_value)
            comb = comb / divisor
            outs.append(comb)
            divisors.append(divisor)
        ctx.dims = dims
        ctx.save_for_backward(*outs, *divisors)
        return comb

    @staticmethod
    @first_order_only
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        saved = ctx.saved_tensors
        outs, divisors = saved[: len(ctx.dims)], saved[len(ctx.dims) :]
        grad = grad.contiguous()  # it arrives through the caller's permute
        for dim, out, divisor in zip(reversed(ctx.dims), reversed(outs), reversed(divisors)):
            grad = (grad - (grad * out).sum(dim=dim, keepdim=True)).div_(divisor)
        return grad, None, None


class _FlatProjection:
    """mHC's and its head's reading of the streams: logits RMSNorm(flatten X) φ (one group of n·d values, φ = ``proj``,
    one row per logit) and pre_j = σ(s_pre z_j + b_j) + ε from the first n of them (``scale[0]``, ``bias[:n]``)."""

    n: int
    eps: float
    norm_eps: float
    proj: nn.Parameter
    bias: nn.Parameter
    scale: nn.Parameter

    def projection(self, dtype):
        return self.proj.to(dtype).T, 1, self.norm_eps  # n·d, k

    def pre_rule(self, dtype):
        return 1, self.scale[0].item(), self.bias[: self.n].detach().to(dtype).contiguous(), self.eps, 1


@register_hyper("mhc")
class ManifoldHyperConnection(_FlatProjection, HyperConnection):
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

    def weights_from_logits(self, logits, lead, dtype):  # logits: B,T,1,(2+n)n
        n = self.n
        pre_w, post_w, res_w = logits.squeeze(-2).split([n, n, n * n], dim=-1)
        pre_b, post_b, res_b = self.bias.to(dtype).split([n, n, n * n])
        s_pre, s_post, s_res = self.scale.to(dtype).unbind(0)
        pre = torch.sigmoid(pre_w * s_pre + pre_b) + self.eps
        post = 2 * torch.sigmoid(post_w * s_post + post_b)
        res_logits = (res_w * s_res + res_b).unflatten(-1, (n, n))  # B,T,n_in,n_out (their comb's layout)
        return pre, post, sinkhorn(res_logits, self.iters, self.eps)

    # The fused boundaries' shortcut past autograd (probe.models.hyper_boundary), as dynamic HC's: post and res from
    # the logits with no graph and every weight gradient by hand, both in C (probe.kernels.hyper_streams: u = z s + b,
    # the sigmoids and Sinkhorn in one call each way; docs/results/benchmarks.md), where the kernels take them

    def tapes(self, streams: torch.Tensor) -> bool:
        """Does this connection take its weights' gradients itself (``taped_*``) at a boundary over ``streams``?"""
        return hyper_streams.takes_mhc_weights(streams, self.n, self.iters)

    def taped_weights(self, logits, dtype):
        """(post (B,T,n), res (B,T,n,n) out × in, the tape), as weights_from_logits; logits: B,T,1,(2+n)n."""
        z = logits.squeeze(-2).contiguous()  # B,T,(2+n)n
        bias, scale = (p.detach().to(dtype).contiguous() for p in (self.bias, self.scale))
        post, res = hyper_streams.mhc_weights_forward(z, bias, scale, self.n, self.iters, self.eps)
        return post, res, {"z": z, "bias": bias, "scale": scale, "sums": (torch.zeros_like(bias), scale.new_zeros(3))}

    def _weights_backward(self, tape, grads, grad_logits: bool):
        z, bias, scale, sums = tape["z"], tape["bias"], tape["scale"], tape["sums"]
        return hyper_streams.mhc_weights_backward(
            z, bias, scale, self.n, self.iters, self.eps, grads, sums, grad_logits
        )

    def logits_grad(self, tape, grad_post, grad_res):
        """post's and res's share of the logits' gradient (B,T,1,(2+n)n; pre's part 0) from theirs (None: none);
        their share of the bias's and scales' gradients kept in the tape."""
        return self._weights_backward(tape, (None, grad_post, grad_res), True).unsqueeze(-2)

    def taped_grads(self, tape, grad_pre, grad_post, grad_res, grad_proj) -> dict:
        """Each trainable parameter's gradient from pre's (B,T,n), the shares logits_grad kept and the projection's
        (n·d, (2+n)n: φ transposed)."""
        self._weights_backward(tape, (grad_pre, None, None), False)
        found = {self.proj: grad_proj.T, self.bias: tape["sums"][0], self.scale: tape["sums"][1]}
        return {p: g.to(p.dtype) for p, g in found.items() if p.requires_grad}


class ManifoldHead(_FlatProjection, nn.Module):
    """DeepSeek-V4's final collapse: Σ_j (σ(RMSNorm(flatten X) φ_j · s + b_j) + ε) X_j, fired at hook_pre."""

    param_roles = {"proj": "mixing_projection", "bias": "mixing", "scale": "mixing"}

    def __init__(self, config):
        super().__init__()
        self.n = n = config.hc_streams
        self.eps, self.norm_eps = config.hc_eps, config.norm_eps
        self.proj = nn.Parameter(torch.empty(n, n * config.d_model))
        self.bias = nn.Parameter(torch.zeros(n))
        self.scale = nn.Parameter(torch.ones(1))
        self.hook_pre = HookPoint()  # B,T,n

    def weights_from_logits(self, logits, lead, dtype):  # logits: B,T,1,n
        return torch.sigmoid(logits.squeeze(-2) * self.scale.to(dtype) + self.bias.to(dtype)) + self.eps, None, None

    def forward(self, streams: torch.Tensor) -> torch.Tensor:  # B,T,n,d -> B,T,d
        pre, _, _ = weights(self, streams)
        return read_streams(self.hook_pre(pre).to(streams.dtype), streams)
