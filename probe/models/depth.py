"""Depth routing: AttnRes, P-LR and S-LR read sites over sub-layer outputs (LR-AttnRes 2026 §3;
docs/definitions.md#depth-routing).

Sources are o_0 = the embedding and o_i = each residual-writing sub-layer's output (attention and MLP
separately). A read site before every sub-layer and before the final norm mixes them with static-query
attention over depth; site 1 sees only the embedding (identity, no query). Block mode keeps the embedding, the
completed block sums and the running partial block. The maths is probe.kernels.depth_attention.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformer_lens.hook_points import HookPoint

from probe.hooks.names import read_site
from probe.kernels import depth_attention
from probe.kernels.depth_attention.dispatch import depth_backend
from probe.kernels.depth_attention.reference import rms_normalize
from probe.models.config import ProbeConfig


def emit_key(raw_key: torch.Tensor) -> torch.Tensor:
    """A P-LR key as the LR-AttnRes authors emit it: RMS-normalised, without gain, with eps the machine epsilon of its
    dtype (their ``norm`` calls ``F.rms_norm`` with eps=None)."""
    return F.rms_norm(raw_key, (raw_key.shape[-1],))


class DepthSources:
    """The sources written so far: values (B,T,d) and routing keys (B,T,r), full or block mode.

    Keys: AttnRes uses the value itself; S-LR the last r coordinates of the value (a view, no copy); P-LR the
    projected key emitted beside the value, RMS-normalised on emission (``plr_key="normalized"``) or raw, and a
    block's key is the sum of its members' keys. Block options (the LR-AttnRes authors'): a block value is divided by
    count**mean_power (AttnRes / S-LR keys follow the scaled value; P-LR keys are not scaled: the read normalises
    them), and prior·log(count) is added to each source's logit (``bias``). ``mean_power`` / ``prior``: floats, or
    0-d learned parameters."""

    def __init__(
        self,
        config: ProbeConfig,
        embed: torch.Tensor,
        embed_key: torch.Tensor | None,
        mean_power: float | torch.Tensor = 0.0,
        prior: float | torch.Tensor = 0.0,
    ):
        self.kind, self.rank = config.depth, config.routing_rank
        self.block_size = (2 * config.n_layers) // config.depth_blocks if config.depth_blocks else 0
        self.normalize_emitted = config.depth == "plr" and config.plr_key == "normalized"
        self.mean_power, self.prior = mean_power, prior
        self.values: list[torch.Tensor] = [embed]
        self.keys: list[torch.Tensor] = [self._key(embed, self._emitted(embed_key))]
        self.counts: list[int] = [1]  # sub-layer outputs summed in each fixed source (the embedding: 1)
        self.partial_value = self.partial_key = None
        self.partial_count = 0
        self._normed: list[torch.Tensor] = []  # RMS-normalised keys of the fixed sources, computed once

    def _emitted(self, raw_key):
        return emit_key(raw_key) if self.normalize_emitted and raw_key is not None else raw_key

    def _key(self, value, key):
        if self.kind == "plr":
            return key
        return value if self.kind == "attnres" else value[..., -self.rank :]

    def _scaled(self, value: torch.Tensor, count: int) -> torch.Tensor:
        """A block value divided by count**mean_power (the authors' block mean; the identity by default)."""
        p = self.mean_power
        if count == 1 or (not torch.is_tensor(p) and p == 0):
            return value
        return value * (torch.exp(-p * math.log(count)).to(value.dtype) if torch.is_tensor(p) else count**-p)

    def add(self, value: torch.Tensor, raw_key: torch.Tensor | None) -> None:
        key = self._emitted(raw_key)
        if not self.block_size:
            self.values.append(value)
            self.keys.append(self._key(value, key))
            self.counts.append(1)
            return
        first = self.partial_count == 0
        self.partial_value = value if first else self.partial_value + value
        if self.kind == "plr":
            self.partial_key = key if first else self.partial_key + key
        self.partial_count += 1
        if self.partial_count == self.block_size:  # the block is complete: it becomes a fixed source
            block = self._scaled(self.partial_value, self.block_size)
            self.values.append(block)
            self.keys.append(self._key(block, self.partial_key))
            self.counts.append(self.block_size)
            self.partial_value = self.partial_key = None
            self.partial_count = 0

    def current(self):
        """(values, keys) visible to the next read site."""
        if self.partial_count:
            partial = self._scaled(self.partial_value, self.partial_count)
            return self.values + [partial], self.keys + [self._key(partial, self.partial_key)]
        return self.values, self.keys

    def bias(self) -> torch.Tensor | None:
        """(S,) logit bias prior·log(count) of the sources of ``current()`` (at least fp32); None without a prior."""
        if not torch.is_tensor(self.prior) and self.prior == 0:
            return None
        counts = self.counts + ([self.partial_count] if self.partial_count else [])
        dtype = torch.promote_types(self.values[0].dtype, torch.float32)
        log_counts = torch.tensor(counts, dtype=dtype, device=self.values[0].device).log()
        return self.prior * log_counts

    def normalized_keys(self, eps: float) -> list[torch.Tensor]:
        """RMS-normalised (fp32) keys of ``current()``: a fixed source's is computed once, for every later site."""
        for k in self.keys[len(self._normed) :]:
            self._normed.append(rms_normalize(k, eps))
        if self.partial_count:
            return self._normed + [rms_normalize(self.current()[1][-1], eps)]
        return list(self._normed)


class DepthRead(nn.Module):
    """One read site: h = Σ_i softmax_i(q · RMSNorm(k_i)) o_i with a static query q initialised to zero.

    Routing keys and depth weights are computed for their hooks only when a hook asks or ``materialize`` is on
    (``probe.materialize``); the plain read takes the backend's fused path."""

    param_roles = {"query": "routing_query"}

    def __init__(self, config: ProbeConfig):
        super().__init__()
        self.query = nn.Parameter(torch.zeros(config.routing_rank))
        self.eps = config.norm_eps
        self.materialize = False  # fire hook_routing_keys / hook_depth_weights on every forward
        self.hook_routing_keys = HookPoint()  # B,T,S,r normalised keys
        self.hook_depth_weights = HookPoint()  # B,T,S weights over sources (sum to 1)

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
        weights = self.hook_depth_weights(res.weights)
        if weights is res.weights:
            return res.h
        return torch.einsum("bts,sbtd->btd", weights.to(values[0].dtype), torch.stack(values))  # edited weights


def site_names(config: ProbeConfig) -> list[str]:
    """Hook prefixes of the 2L read sites that have a query, in order (site 1 is the identity)."""
    sites = []
    for l in range(config.n_layers):
        if l > 0:
            sites.append(read_site(l, "attn"))
        sites.append(read_site(l, "mlp"))
    return sites + [read_site(None)]


def site_sources(config: ProbeConfig) -> dict[str, list[str]]:
    """For every read site with a query, the identity of each source slot it reads, in order.

    Full mode: 'embed', 'attn{l}', 'mlp{l}'. Block mode: 'embed', 'block{n}' (completed), 'partial'."""
    labels = ["embed"]
    written = []
    for l in range(config.n_layers):
        written += [f"attn{l}", f"mlp{l}"]
    out = {}
    for t, name in enumerate(site_names(config), start=2):  # site t reads o_0 .. o_{t-1}
        seen = written[: t - 1]
        if not config.depth_blocks:
            out[name] = labels + seen
        else:
            c = (2 * config.n_layers) // config.depth_blocks
            n_done, rest = divmod(len(seen), c)
            out[name] = labels + [f"block{i + 1}" for i in range(n_done)] + (["partial"] if rest else [])
    return out
