"""Dense cross-layer connections over block hidden states (Pagliardini et al. 2024, Xiao et al. 2025;
docs/definitions.md#dense-connections).

X_0 is the embedding and X_i the output of block i. After block i the next block reads X̄_i = Σ_{j≤i} A_ij X_j.
DenseFormer: static weights, one stream, one-hot on X_i at init. MUDD: per-token weights for each of the
query, key, value and residual streams, A_i = GELU(RMSNorm(X_i) W1) W2 + a_i with W2 = 0 and a_i one-hot on X_i,
so at init both equal a plain transformer.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformer_lens.hook_points import HookPoint

from probe.models.config import ProbeConfig
from probe.models.layers import RMSNorm


def mudd_hidden_width(config: ProbeConfig, layer: int, width: int) -> int:
    """The hidden width of MUDD's per-token weight network after block ``layer`` (``width`` = C·S outputs): width
    itself, x4 on the last layer with mudd_expand_last, then with mudd_round64 (h // 64 + 1)·64 (MUDDFormer's
    round64: the next multiple of 64 strictly above h, so 64 becomes 128)."""
    hidden = width
    if config.mudd_expand_last and layer == config.n_layers - 1:
        hidden *= 4
    if config.mudd_round64:
        hidden = (hidden // 64 + 1) * 64
    return hidden


class DenseMix(nn.Module):
    param_roles = {"bias": "mixing", "w1": "mixing_projection", "w2": "mixing"}

    def __init__(self, config: ProbeConfig, layer: int, streams: int):
        super().__init__()
        self.kind, self.streams, self.n_src = config.dense, streams, layer + 2  # sources X_0 .. X_{layer+1}
        one_hot = torch.zeros(streams, self.n_src)
        one_hot[:, -1] = 1.0
        self.bias = nn.Parameter(one_hot)  # a_i (DenseFormer: the static weights themselves)
        if self.kind == "mudd":
            width = streams * self.n_src
            hidden = mudd_hidden_width(config, layer, width)
            self.norm = RMSNorm(config.d_model, config.norm_eps)
            self.w1 = nn.Linear(config.d_model, hidden, bias=False)
            self.w2 = nn.Linear(hidden, width, bias=False)
            nn.init.zeros_(self.w2.weight)  # W2 = 0: no dynamic part at init
        self.hook_weights = HookPoint()  # B,T,C,S

    def forward(self, hiddens: list[torch.Tensor]) -> list[torch.Tensor]:
        x = hiddens[-1]  # B,T,d
        B, T, _ = x.shape
        if self.kind == "mudd":
            dyn = self.w2(F.gelu(self.w1(self.norm(x)))).view(B, T, self.streams, self.n_src)
            weights = dyn + self.bias  # B,T,C,S
        else:
            weights = self.bias.expand(B, T, self.streams, self.n_src)
        weights = self.hook_weights(weights)
        stacked = torch.stack(hiddens, dim=2)  # B,T,S,d
        mixed = torch.einsum("btcs,btsd->btcd", weights.to(x.dtype), stacked)
        return list(mixed.unbind(2))  # C streams of B,T,d
