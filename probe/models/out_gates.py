"""Output gates (Qiu et al. 2025's G1, docs/definitions.md#output-gates): one small module each, registered by name
for `out_gate=`.

A gate reads x (B,T,d), the normed input the q/k/v projections read, and returns g = σ(x W_g) in fp32 (fp64 in an
fp64 model), per element
of each head's attention output (B,T,H,dv) or one per head (B,T,H). Attention fires `hook_out_gate` on g and
multiplies the attention op's output Y (B,T,H,dv) by it before the output projection: Y_h ← Y_h ⊙ g_h. Unlike a value
gate (probe.models.gates), which scales what a key offers every query, this scales what each query's row returns.

W_g is drawn like the query projection (the authors' gate is extra rows of q_proj, initialised with it); a gate owns
its projection and declares its role (`param_roles`, params.py). A new gate is a subclass plus
`@register_out_gate(name)`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from probe.models.choice import check_choice
from probe.models.registry import registrar

OUT_GATES: dict[str, type[OutputGate]] = {}


register_out_gate = registrar(OUT_GATES, "out_gate")


@dataclass
class OutGateOptions:
    """ProbeConfig's output-gate group."""

    out_gate: str = "none"  # "none" or a registered output gate (OUT_GATES) on each head's attention output

    def check(self) -> None:
        check_choice("out_gate", self.out_gate, ("none", *OUT_GATES))


class OutputGate(nn.Module):
    param_roles = {"proj": "gate_projection"}
    headwise = False  # True: one gate per head (B,T,H); False: one per coordinate (B,T,H,dv)

    def __init__(self, config):  # every gate is built as OUT_GATES[name](config)
        super().__init__()
        self.n_heads = config.n_heads
        self.per_head = 1 if self.headwise else config.d_value
        self.proj = nn.Linear(config.d_model, config.n_heads * self.per_head, bias=False)  # W_g

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """g = σ(x W_g) in fp32 or wider: (B,T,H,dv) element-wise, (B,T,H) headwise."""
        B, T, _ = x.shape
        g = torch.sigmoid(_at_least_fp32(self.proj(x))).view(B, T, self.n_heads, self.per_head)
        return g.squeeze(-1) if self.headwise else g


@register_out_gate("elementwise")
class ElementwiseOutGate(OutputGate):
    """G1 element-wise: one gate per coordinate of each head's output, W_g of d × (H·dv)."""


@register_out_gate("headwise")
class HeadwiseOutGate(OutputGate):
    """G1 headwise: one gate per head and query, broadcast over the head's coordinates, W_g of d × H."""

    headwise = True


def make_out_gate(config) -> OutputGate | None:
    return None if config.out_gate == "none" else OUT_GATES[config.out_gate](config)


def apply_out_gate(gate: OutputGate | None, y: torch.Tensor, x: torch.Tensor, hook=None) -> torch.Tensor:
    """Y ⊙ σ(x W_g) in y's dtype: y (B,T,H,dv) the attention op's output, x (B,T,d) the normed attention input.

    ``hook`` (Attention's hook_out_gate) sees the gate and may return an edited one (same shape)."""
    if gate is None:
        return y
    g = gate(x)
    g = hook(g) if hook is not None else g
    g = g if g.dim() == y.dim() else g[..., None]
    return (_at_least_fp32(g) * _at_least_fp32(y)).to(y.dtype)


def _at_least_fp32(t: torch.Tensor) -> torch.Tensor:
    """fp16 / bf16 up to fp32; fp32 and fp64 as they are."""
    return t.to(torch.promote_types(t.dtype, torch.float32))
