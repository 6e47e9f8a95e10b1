"""AttnRes, S-LR and P-LR (Kimi Team 2026; LR-AttnRes 2026 §3; docs/definitions.md#depth-routing): static-query
attention over depth, α = softmax_i(q · RMSNorm(k_i)), the maths in probe.kernels.depth_attention.

The three differ only in their routing keys: AttnRes reads the value itself (r = d), S-LR its last r coordinates (a
view, no copy), P-LR a key each sub-layer's output projection emits beside it (and W_0^K for the embedding).
"""

from __future__ import annotations

import torch
import torch.nn as nn
from transformer_lens.hook_points import HookPoint

from probe.hooks.fire import fire
from probe.kernels import depth_attention
from probe.kernels.depth_attention.dispatch import depth_backend
from probe.models.depth import DepthRead, DepthSources, register_depth, weighted_sum


class StaticQueryRead(DepthRead):
    """One read site: h = Σ_i softmax_i(q · RMSNorm(k_i)) o_i with a static query q initialised to zero.

    Routing keys and depth weights are computed for their hooks only when a hook asks or ``materialize`` is on
    (``probe.materialize``); the plain read takes the backend's fused path."""

    param_roles = {"query": "routing_query"}

    def __init__(self, config):
        super().__init__(config)
        self.query = nn.Parameter(torch.zeros(self.key_width(config)))
        self.eps = config.norm_eps
        self.hook_routing_keys = HookPoint()  # B,T,S,r normalised keys

    def forward(self, sources: DepthSources) -> torch.Tensor:
        values, keys = sources.current()
        hooked, normalize = self.materialize or self.hook_routing_keys.has_hooks(), True
        if hooked or depth_backend(values[0]) != "triton":  # torch read: each source normalised once
            keys, normalize = sources.normalized_keys(self.eps), False
            if hooked:
                keys = list(self.hook_routing_keys(torch.stack(keys, dim=2)).unbind(2))
        want_weights = self.materialize or self.hook_depth_weights.has_hooks()
        res = depth_attention(
            values,
            keys,
            self.query,
            bias=sources.bias(),
            normalize=normalize,
            eps=self.eps,
            return_weights=want_weights,
            backend="torch" if want_weights else None,
        )
        if not want_weights:
            return res.h
        weights, edited = fire(self.hook_depth_weights, res.weights)
        if not edited:
            return res.h
        return weighted_sum(weights, values)  # edited weights


@register_depth("attnres")
class AttnRes(StaticQueryRead):
    """k_i = o_i: full-width keys (r = d)."""

    @staticmethod
    def key_width(config) -> int:
        return config.d_model

    @staticmethod
    def value_key(value, width):
        return value


class LowRankRead(StaticQueryRead):
    """Keys of rank r = depth_rank."""

    @staticmethod
    def key_width(config) -> int:
        return config.depth_rank

    @classmethod
    def check(cls, config) -> None:
        if not config.depth_rank or not 0 < config.depth_rank <= config.d_model:
            raise ValueError(
                f"depth_rank={config.depth_rank!r} must be in 1..d_model={config.d_model} for depth={config.depth!r}"
            )


@register_depth("slr")
class SLR(LowRankRead):
    """S-LR: k_i = the last r coordinates of o_i; S-LR with r = d equals AttnRes."""

    @staticmethod
    def value_key(value, width):
        return value[..., -width:]


@register_depth("plr")
class PLR(LowRankRead):
    """P-LR: each output projection emits d + r rows, the last r are the key (LR-AttnRes 2026 Eq. 12-13)."""

    emits_keys = True

    @classmethod
    def check(cls, config) -> None:
        super().check(config)
        for field in ("linear_bias", "mlp_bias"):
            if getattr(config, field):
                raise ValueError(
                    f"{field}=True does not compose with depth={config.depth!r} (its routing keys share the output "
                    "projection's matmul)"
                )
