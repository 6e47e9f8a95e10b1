"""FoX's forget gate (Lin et al., ICLR 2025, "Forgetting Transformer"; docs/definitions.md#forget-gate).

Per head (per KV head: a query head reads its KV head's gate, as its keys) a scalar gate from the layer's normalised
input, f_t = σ(w_h·x_t + b_h), and the logits of query i on key j ≤ i take D_ij = Σ_{l=j+1..i} log f_l. With c_t =
Σ_{l≤t} log f_l, D_ij = c_i - c_j, and softmax ignores the row's c_i: FoX is softmax attention with the per-key bias
-c_j (B,Hkv,T), which the attention op takes as ``key_bias``, so its fused path, Triton kernel and the streaming row
masses run unchanged.

The authors' data-dependent gate ("full" fgate_type) is a linear layer with a bias, the bias initialised to 0
(f = 1/2 at a zero input; their special bias init is only for their data-independent gates); the weight is decayed
with the other projections, the bias is not (their optimiser leaves every bias undecayed).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformer_lens.hook_points import HookPoint

from probe.hooks.attention_rules import forget_key_bias
from probe.hooks.fire import fire
from probe.kernels.common import wide


class ForgetGate(nn.Module):
    param_roles = {"proj": "gate_projection", "bias": "gate"}

    def __init__(self, d_model: int, n_kv_heads: int):
        super().__init__()
        self.proj = nn.Linear(d_model, n_kv_heads, bias=False)  # w_h per KV head
        self.bias = nn.Parameter(torch.zeros(n_kv_heads))  # b_h, the authors' init 0: f = σ(w_h·x_t) at start

    def forward(self, x: torch.Tensor, hook: HookPoint) -> torch.Tensor:
        """The key bias -c_j (B,Hkv,T), fp32 (fp64 for an fp64 model), of x (B,T,d); fires ``hook`` with f (B,T,Hkv).
        Unedited, log f is logsigmoid of the logit, exact where f rounds to 1; an edited f is taken as it is."""
        logit = wide(self.proj(x)) + self.bias.to(wide(x).dtype)  # B,T,Hkv
        gate = torch.sigmoid(logit)
        fired, edited = fire(hook, gate)
        log_gate = torch.log(fired) if edited else F.logsigmoid(logit)
        return forget_key_bias(log_gate)
