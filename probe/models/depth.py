"""Depth routing over sub-layer outputs (docs/definitions.md#depth-routing): the sources, the read sites, and the
registry of the mechanisms that weigh them (`depth=`; AttnRes, S-LR and P-LR in depth_mechanisms/attnres.py).

Sources are o_0 = the embedding and o_i = each residual-writing sub-layer's output (attention and MLP
separately). A read site before every sub-layer and before the final norm mixes them, h = Σ_i α_i o_i, with the
weights α its mechanism computes; site 1 sees only the embedding (identity, no read). Block mode keeps the embedding,
the completed block sums and the running partial block.

A depth mechanism is a `DepthRead` subclass registered with `@register_depth(name)`: it says how its sources are keyed
(`key_width`, `value_key` or `emits_keys`) and computes α in `forward`, firing `hook_depth_weights` on it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformer_lens.hook_points import HookPoint

from probe.hooks.names import read_site
from probe.kernels.depth_attention.reference import rms_normalize
from probe.models.choice import check_choice
from probe.models.registry import registrar

DEPTHS: dict[str, type[DepthRead]] = {}


register_depth = registrar(DEPTHS, "depth")

# P-LR routing keys: "normalized" RMS-normalises each key as it is emitted (eps: the dtype's machine epsilon, as the
# LR-AttnRes authors' model.py), so a block's key is the sum of normalised keys, normalised again at the read; "raw"
# sums raw keys and normalises once at the read (how probe's checkpoints before this field were trained)
PLR_KEYS = ("normalized", "raw")


@dataclass
class DepthOptions:
    """ProbeConfig's depth-routing group: the read over sub-layer outputs, its blocks and rank, and the LR-AttnRes
    authors' block options (their attnres_block_average / attnres_block_count_prior, shared scope). The rules that
    read other groups (the mechanism's own ``check``, blocks dividing 2L) are ProbeConfig.validate's."""

    depth: str = "residual"  # "residual" or a registered read (DEPTHS)
    depth_blocks: int = 0  # 0: full depth routing; N: block routing with N blocks
    depth_rank: int | None = None  # routing-key rank r for plr/slr (attnres uses d_model)
    plr_key: str = "normalized"  # see PLR_KEYS; a saved config without the field loads as "raw" (ProbeConfig.from_dict)
    depth_block_mean: float = 0.0  # p: a block source's value is divided by count**p (1: the mean, 0.5: sqrt)
    depth_block_mean_learned: bool = False  # p is one learned scalar (initialised to depth_block_mean)
    depth_block_prior: float = 0.0  # β: β·log(count) is added to a block source's logit (1: their prior)
    depth_block_prior_learned: bool = False  # β is one learned scalar (initialised to depth_block_prior)

    def __post_init__(self) -> None:
        self.depth_block_mean = float(self.depth_block_mean)
        self.depth_block_mean_learned = bool(self.depth_block_mean_learned)
        self.depth_block_prior = float(self.depth_block_prior)
        self.depth_block_prior_learned = bool(self.depth_block_prior_learned)

    def check(self) -> None:
        check_choice("depth", self.depth, ("residual", *DEPTHS))
        check_choice("plr_key", self.plr_key, PLR_KEYS)
        if self.depth_blocks and self.depth == "residual":
            raise ValueError(f"depth_blocks needs depth routing (depth one of {', '.join(map(repr, DEPTHS))})")
        for field in ("depth_block_mean", "depth_block_mean_learned", "depth_block_prior", "depth_block_prior_learned"):
            if getattr(self, field) and not self.depth_blocks:
                raise ValueError(
                    f"{field}={getattr(self, field)!r} needs block depth routing (depth_blocks > 0); got depth_blocks=0"
                )


def emit_key(raw_key: torch.Tensor) -> torch.Tensor:
    """An emitted key as the LR-AttnRes authors emit it: RMS-normalised, without gain, with eps the machine epsilon of
    its dtype (their ``norm`` calls ``F.rms_norm`` with eps=None)."""
    return F.rms_norm(raw_key, (raw_key.shape[-1],))


def weighted_sum(weights: torch.Tensor, values: list[torch.Tensor]) -> torch.Tensor:
    """Σ_i α_i o_i: weights (B,T,S) over S values (B,T,d) -> (B,T,d) in the values' dtype."""
    return torch.einsum("bts,sbtd->btd", weights.to(values[0].dtype), torch.stack(values))


class DepthRead(nn.Module):
    """One read site of a depth mechanism: h = Σ_i α_i o_i over the sources written so far, α (B,T,S) fired at
    ``hook_depth_weights`` (a hook may edit it).

    A mechanism declares how its sources are keyed: ``key_width(config)`` (r, 0 for no keys), then either
    ``value_key`` (a source's key from its value) or ``emits_keys = True`` (every sub-layer's output projection emits
    an r-dim key beside its output, the embedding's from an r x d projection W_0^K; a block's key is the sum of its
    members'). ``check(config)`` rejects settings it cannot take; ``param_roles`` declares its parameters
    (params.py)."""

    emits_keys = False
    param_roles: dict[str, str] = {}

    def __init__(self, config=None):  # every read is built as DEPTHS[name](config)
        super().__init__()
        self.materialize = False  # fire the weights' (and keys') hooks on every forward (probe.materialize)
        self.hook_depth_weights = HookPoint()  # B,T,S weights over sources

    @staticmethod
    def key_width(config) -> int:
        """The width r of the routing keys (0: the mechanism reads no keys)."""
        return 0

    @staticmethod
    def value_key(value: torch.Tensor, width: int) -> torch.Tensor | None:
        """A source's routing key (B,T,r) from its value (B,T,d), for mechanisms that do not emit keys."""
        return None

    @classmethod
    def check(cls, config) -> None:
        """Raise ValueError, naming the field, for settings this mechanism cannot take."""

    def forward(self, sources: DepthSources) -> torch.Tensor:
        """h (B,T,d) of the sources visible now (``sources.current()``)."""
        raise NotImplementedError

    def read(self, weights: torch.Tensor, values: list[torch.Tensor]) -> torch.Tensor:
        """``weighted_sum`` of weights (B,T,S) that pass ``hook_depth_weights`` first."""
        return weighted_sum(self.hook_depth_weights(weights), values)


def mechanism(config) -> type[DepthRead] | None:
    """The registered read of ``config.depth``; None for the plain residual stream."""
    return None if config.depth == "residual" else DEPTHS[config.depth]


def emitted_key_width(config) -> int:
    """The rank of the keys each sub-layer emits beside its output (0 unless the mechanism emits keys)."""
    read = mechanism(config)
    return read.key_width(config) if read is not None and read.emits_keys else 0


class DepthSources:
    """The sources written so far: values (B,T,d) and routing keys (B,T,r; None without keys), full or block mode.

    Keys come from the mechanism (``DepthRead.value_key`` of the value, or the key emitted beside it); an emitted key
    is RMS-normalised on emission (``plr_key="normalized"``) or kept raw. Block options (the LR-AttnRes authors'): a
    block value is divided by count**mean_power (value keys follow the scaled value; emitted keys are not scaled: the
    read normalises them), and prior·log(count) is added to each source's logit (``bias``). ``mean_power`` /
    ``prior``: floats, or 0-d learned parameters."""

    def __init__(
        self,
        config,
        embed: torch.Tensor,
        embed_key: torch.Tensor | None,
        mean_power: float | torch.Tensor = 0.0,
        prior: float | torch.Tensor = 0.0,
    ):
        read = mechanism(config)
        assert read is not None, "DepthSources serves a depth-routed model"
        self.emits, self.value_key, self.rank = read.emits_keys, read.value_key, read.key_width(config)
        self.block_size = (2 * config.n_layers) // config.depth_blocks if config.depth_blocks else 0
        self.normalize_emitted = self.emits and config.plr_key == "normalized"
        self.mean_power, self.prior = mean_power, prior
        self.values: list[torch.Tensor] = [embed]
        self.keys: list[torch.Tensor | None] = [self._key(embed, self._emitted(embed_key))]
        self.counts: list[int] = [1]  # sub-layer outputs summed in each fixed source (the embedding: 1)
        self.partial_value = self.partial_key = None
        self.partial_count = 0
        self._normed: list[torch.Tensor] = []  # RMS-normalised keys of the fixed sources, computed once

    def _emitted(self, raw_key):
        return emit_key(raw_key) if self.normalize_emitted and raw_key is not None else raw_key

    def _key(self, value, key):
        return key if self.emits else self.value_key(value, self.rank)

    def _scaled(self, value: torch.Tensor, count: int) -> torch.Tensor:
        """A block value divided by count**mean_power (the authors' block mean; the identity by default)."""
        factor = block_factor(count, self.mean_power)
        if isinstance(factor, torch.Tensor):
            return value * factor.to(value.dtype)
        return value if factor == 1.0 else value * factor

    def add(self, value: torch.Tensor, raw_key: torch.Tensor | None) -> None:
        key = self._emitted(raw_key)
        if not self.block_size:
            self.values.append(value)
            self.keys.append(self._key(value, key))
            self.counts.append(1)
            return
        first = self.partial_count == 0
        self.partial_value = value if first else self.partial_value + value
        if self.emits:
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


def block_factor(count: int, mean_power: float | torch.Tensor) -> float | torch.Tensor:
    """What a block source of ``count`` sub-layer outputs is multiplied by: count**-mean_power (the LR-AttnRes
    authors' block mean; 1.0 for one output or power 0), a 0-d tensor for a learned power."""
    if count == 1 or (not torch.is_tensor(mean_power) and mean_power == 0):
        return 1.0
    return torch.exp(-mean_power * math.log(count)) if torch.is_tensor(mean_power) else count**-mean_power


def make_read(config) -> DepthRead:
    return DEPTHS[config.depth](config)


def site_names(config) -> list[str]:
    """Hook prefixes of the 2L read sites that read (site 1 is the identity), in order."""
    sites = []
    for l in range(config.n_layers):
        if l > 0:
            sites.append(read_site(l, "attn"))
        sites.append(read_site(l, "mlp"))
    return sites + [read_site(None)]


def site_sources(config) -> dict[str, list[str]]:
    """For every read site that reads, the identity of each source slot it reads, in order.

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
