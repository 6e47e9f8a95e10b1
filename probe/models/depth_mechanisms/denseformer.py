"""DenseFormer (Pagliardini et al. 2024) and MUDD (Xiao et al. 2025): dense connections over block hidden states
(docs/definitions.md#dense-connections).

DenseFormer: static weights a_i, one stream, one-hot on X_i at init. MUDD adds per-token weights for each of the
query, key, value and residual streams, A_i = GELU(RMSNorm(X_i) W1) W2 + a_i with W2 = 0, so at init both equal a
plain transformer.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from probe.models.dense import DenseMix, register_dense
from probe.models.layers import RMSNorm


@register_dense("denseformer")
class DenseFormer(DenseMix):
    """A_i = a_i, static: the weights are the parameters themselves."""

    param_roles = {"bias": "mixing"}

    def __init__(self, config, layer: int):
        super().__init__(config, layer)
        one_hot = torch.zeros(self.streams, self.n_src)
        one_hot[:, -1] = 1.0
        self.bias = nn.Parameter(one_hot)  # a_i

    def weights(self, x):
        B, T, _ = x.shape
        # a copy, not an expanded view: a hook that edits it in place edits this forward's mix, not the parameter
        return self.bias.expand(B, T, self.streams, self.n_src).clone()


def mudd_hidden_width(config, layer: int, width: int) -> int:
    """The hidden width of MUDD's per-token weight network after block ``layer`` (``width`` = C·S outputs): width
    itself, x4 on the last layer with mudd_expand_last, then with mudd_round64 (h // 64 + 1)·64 (MUDDFormer's
    round64: the next multiple of 64 strictly above h, so 64 becomes 128)."""
    hidden = width
    if config.mudd_expand_last and layer == config.n_layers - 1:
        hidden *= 4
    if config.mudd_round64:
        hidden = (hidden // 64 + 1) * 64
    return hidden


@register_dense("mudd")
class MUDD(DenseFormer):
    """A_i = GELU(RMSNorm(X_i) W1) W2 + a_i per stream: the next block's query, key, value and residual inputs (the
    residual alone after the last block)."""

    # options of MUDDFormer's released checkpoints (Caiyun-AI/MUDDFormer; docs/definitions.md#dense-connections)
    options = ("mudd_round64", "mudd_expand_last", "dense_stream_norms")
    param_roles = {"bias": "mixing", "w1": "mixing_projection", "w2": "mixing"}

    def __init__(self, config, layer: int):
        super().__init__(config, layer)
        width = self.streams * self.n_src
        hidden = mudd_hidden_width(config, layer, width)
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self.w1 = nn.Linear(config.d_model, hidden, bias=False)
        self.w2 = nn.Linear(hidden, width, bias=False)
        nn.init.zeros_(self.w2.weight)  # W2 = 0: no dynamic part at init

    @staticmethod
    def n_streams(config, layer: int) -> int:
        return 1 if layer == config.n_layers - 1 else 4

    def weights(self, x):
        B, T, _ = x.shape
        dyn = self.w2(F.gelu(self.w1(self.norm(x)))).view(B, T, self.streams, self.n_src)
        return dyn + self.bias  # B,T,C,S
