"""Dense cross-layer connections over block hidden states (docs/definitions.md#dense-connections): the mix after each
block, and the registry of the mechanisms that weigh it (`dense=`; DenseFormer and MUDD in
depth_mechanisms/denseformer.py).

X_0 is the embedding and X_i the output of block i. After block i the next block reads X̄_i = Σ_{j≤i} A_ij X_j per
stream: one stream (the residual), or MUDD's four (the next block's query, key, value and residual inputs).

A dense mechanism is a `DenseMix` subclass registered with `@register_dense(name)`: it says how many streams it writes
(`n_streams`) and computes the weights A (B,T,C,S) in `weights`; the mix fires `hook_weights` on them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
from transformer_lens.hook_points import HookPoint

from probe.models.choice import check_choice
from probe.models.registry import registrar

DENSES: dict[str, type[DenseMix]] = {}


register_dense = registrar(DENSES, "dense")


@dataclass
class DenseOptions:
    """ProbeConfig's dense-connection group: the mix after each block and the options of MUDDFormer's released
    checkpoints (Caiyun-AI/MUDDFormer; docs/definitions.md#dense-connections), each read by one mix only
    (``DenseMix.options``)."""

    dense: str = "none"  # "none" or a registered mix (DENSES)
    mudd_round64: bool = False  # their round64: dense-network hidden width (h // 64 + 1) * 64
    mudd_expand_last: bool = False  # their expand_last: the last layer's dense-network hidden width x4
    dense_stream_norms: bool = False  # their sepln: blocks > 0 norm the q, k, v streams with separate norms

    def __post_init__(self) -> None:
        self.mudd_round64 = bool(self.mudd_round64)
        self.mudd_expand_last = bool(self.mudd_expand_last)
        self.dense_stream_norms = bool(self.dense_stream_norms)

    def check(self) -> None:
        check_choice("dense", self.dense, ("none", *DENSES))
        for name, mix in DENSES.items():
            for field in mix.options:
                if getattr(self, field) and self.dense != name:
                    raise ValueError(f"{field}=True needs dense={name!r}; got dense={self.dense!r}")


class DenseMix(nn.Module):
    """The mix after block ``layer`` over the block states X_0 .. X_{layer+1}: C streams of Σ_s A_{c,s} X_s.

    ``options``: the config fields only this mechanism reads (set while another is chosen is an error);
    ``param_roles`` declares its parameters (params.py)."""

    options: tuple[str, ...] = ()
    param_roles: dict[str, str] = {}

    def __init__(self, config, layer: int):  # every mix is built as DENSES[name](config, layer)
        super().__init__()
        self.streams, self.n_src = self.n_streams(config, layer), layer + 2  # sources X_0 .. X_{layer+1}
        self.hook_weights = HookPoint()  # B,T,C,S

    @staticmethod
    def n_streams(config, layer: int) -> int:
        """The streams the mix after block ``layer`` writes: 1 (the residual) or 4 (query, key, value, residual)."""
        return 1

    def weights(self, x: torch.Tensor) -> torch.Tensor:
        """A (B,T,C,S) from the latest block state x (B,T,d)."""
        raise NotImplementedError

    def forward(self, hiddens: list[torch.Tensor]) -> list[torch.Tensor]:
        x = hiddens[-1]  # B,T,d
        weights = self.hook_weights(self.weights(x))
        stacked = torch.stack(hiddens, dim=2)  # B,T,S,d
        mixed = torch.einsum("btcs,btsd->btcd", weights.to(x.dtype), stacked)
        return list(mixed.unbind(2))  # C streams of B,T,d


def make_mix(config, layer: int) -> DenseMix:
    return DENSES[config.dense](config, layer)
