"""Value gates (Wang 2026 §3.3, GatedV; docs/definitions.md#value-gates): one small module each, registered by name for
`value_gate=`.

A gate reads the value v_j (B,T,Hkv,dv: the read after any value-residual mix) and the layer's value-stream input x
(B,T,d), and returns g in fp32, per key and KV head (B,T,Hkv) or per element (B,T,Hkv,dv). Attention fires
`hook_v_gate` on g and then, in the value slot, aggregates g ⊙ v; in the routing slot (`routing = True`) the values
pass unchanged and log g_j is added to key j's logits (`log_gate`, exact where g underflows).

Each gate declares the role of every parameter it owns (`param_roles`, see params.py: weight decay and random or
constant init) and gives constants their documented value here. A new gate is a subclass plus `@register_gate(name)`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from probe.hooks.names import layer_of
from probe.models.choice import check_choice
from probe.models.registry import registrar

GATES: dict[str, type[ValueGate]] = {}


register_gate = registrar(GATES, "value_gate")

# the value-residual mix of each layer's values with layer 0's: "lambda" one learned weight, "two-weight" two
VALUE_RESIDUALS = ("none", "lambda", "two-weight")


@dataclass
class ValueGateOptions:
    """ProbeConfig's value-gate group: the gate on each key's value and the value-residual mix."""

    value_gate: str = "none"  # "none" or a registered gate (GATES)
    gate_beta: float = 8.0  # the norm gates' fixed slope β
    gate_tau_init: float | None = None  # the norm gates' initial τ; None: initial_read_norm(config)
    value_residual: str = "none"  # see VALUE_RESIDUALS

    def check(self) -> None:
        check_choice("value_gate", self.value_gate, ("none", *GATES))
        check_choice("value_residual", self.value_residual, VALUE_RESIDUALS)
        if self.value_gate == "glu" and self.value_residual != "none":
            raise ValueError("value_residual does not compose with the GLU value (different value widths)")


def initial_read_norm(config) -> float:
    """Expected ‖v_j‖/√dh of the initial model: the default norm-gate threshold τ_h.

    The input of W_V is normalised (unit RMS per coordinate), so each coordinate of v has the standard
    deviation of W_V's entries times √d_model. Placing τ there opens half the gate at init (Wang 2026
    leaves τ's init unspecified; see docs/definitions.md#value-gates)."""
    std = 0.02 if config.init == "gpt2" else 1 / math.sqrt(config.d_model)
    return std * math.sqrt(config.d_model)


class ValueGate(nn.Module):
    routing = False  # True: the routing slot (log g_j on the logits, values unchanged)
    param_roles: dict[str, str] = {}

    def __init__(self, config=None):  # every gate is built as GATES[name](config)
        super().__init__()

    def forward(self, v: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The gate g, fp32: (B,T,Hkv) per key or (B,T,Hkv,dv) per element."""
        raise NotImplementedError

    def log_gate(self, v: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """log g (B,T,Hkv), for routing-slot gates."""
        raise NotImplementedError(f"{type(self).__name__} is a value-slot gate")

    def direction(self) -> torch.Tensor | None:
        """The gate's own read direction w_h (Hkv, dv) when g is a function of w_h·v_j, else None."""
        return None


@register_gate("norm")
class NormGate(ValueGate):
    """g_j = σ(β(‖v_j‖/√dv − τ_h)), β fixed (8), τ_h learned per KV head, starting at the initial read norm."""

    param_roles = {"tau": "gate"}

    def __init__(self, config):
        super().__init__()
        tau = config.gate_tau_init if config.gate_tau_init is not None else initial_read_norm(config)
        self.tau = nn.Parameter(torch.full((config.n_kv_heads,), float(tau)))
        self.beta = config.gate_beta

    def logit(self, v: torch.Tensor) -> torch.Tensor:
        rms = v.float().norm(dim=-1) / math.sqrt(v.shape[-1])  # B,T,Hkv  ‖v‖/√dv
        return self.beta * (rms - self.tau.float())

    def forward(self, v, x):
        return torch.sigmoid(self.logit(v))


@register_gate("routing-norm")
class RoutingNormGate(NormGate):
    """The norm gate in the routing slot (abstention's control): log g_j = logsigmoid(z_j) joins key j's logits."""

    routing = True

    def log_gate(self, v, x):
        return F.logsigmoid(self.logit(v))


@register_gate("proj")
class ProjGate(ValueGate):
    """g_j = σ(w_h·v_j + b_h); w = 0 and b = 0 at init, so every gate starts at ½."""

    param_roles = {"w": "gate", "b": "gate"}

    def __init__(self, config):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(config.n_kv_heads, config.d_value))
        self.b = nn.Parameter(torch.zeros(config.n_kv_heads))

    def forward(self, v, x):
        return torch.sigmoid((v.float() * self.w.float()).sum(-1) + self.b.float())  # B,T,Hkv

    def direction(self):
        return self.w


@register_gate("silu")
class SiluGate(ValueGate):
    """GatedV: v ⊙ σ(v) (SiLU), the gate σ(v) per element."""

    def forward(self, v, x):
        return torch.sigmoid(v.float())


@register_gate("tanh")
class TanhGate(ValueGate):
    """GatedV control: v ⊙ tanh(v)."""

    def forward(self, v, x):
        return torch.tanh(v.float())


@register_gate("g2")
class G2Gate(ValueGate):
    """Gated Attention's G2: a headwise sigmoid gate from the layer input, σ(x W_g) (B,T,Hkv)."""

    param_roles = {"proj": "gate_projection"}

    def __init__(self, config):
        super().__init__()
        self.proj = nn.Linear(config.d_model, config.n_kv_heads, bias=False)

    def forward(self, v, x):
        return torch.sigmoid(self.proj(x).float())


@register_gate("glu")
class GLUGate(ValueGate):
    """GLU value: (x W_V) ⊙ SiLU(x W_G), the gate SiLU(x W_G) per element (it is not bounded by 1)."""

    param_roles = {"proj": "gate_projection"}

    def __init__(self, config):
        super().__init__()
        self.proj = nn.Linear(config.d_model, config.n_kv_heads * config.d_value, bias=False)

    def forward(self, v, x):
        return F.silu(self.proj(x).float()).view(v.shape)


def gate_directions(model) -> dict[int, torch.Tensor | None]:
    """Per layer with a value gate, the gate's ``direction()`` (Hkv, dv) or None, found in the module tree."""
    return {
        layer_of(path): module.direction() for path, module in model.named_modules() if isinstance(module, ValueGate)
    }


def make_gate(config) -> ValueGate | None:
    return None if config.value_gate == "none" else GATES[config.value_gate](config)


def apply_gate(gate: ValueGate | None, v: torch.Tensor, x: torch.Tensor, hook=None):
    """(values to aggregate B,T,Hkv,dv in v.dtype, per-key logit bias B,Hkv,T fp32 or None) of a gated read.

    ``hook`` (Attention's hook_v_gate) sees the gate and may return an edited one. In the routing slot the bias is the
    gate's own ``log_gate`` (logsigmoid of the logit: finite where g underflows), or the log of an edited gate."""
    if gate is None:
        return v, None
    hook = hook or (lambda g: g)
    if gate.routing:  # values unchanged, log g_j on key j's logits
        log_g = gate.log_gate(v, x)  # B,T,Hkv fp32
        g = torch.exp(log_g)
        seen = hook(g)
        if seen is not g:  # edited: clamped so a closed gate is a very negative logit, not -inf (no NaN rows)
            log_g = torch.log(seen.float().clamp_min(1e-30))
        return v, log_g.transpose(1, 2)
    g = hook(gate(v, x))  # B,T,Hkv (per key) or B,T,Hkv,dv (per element)
    g = g if g.dim() == v.dim() else g[..., None]
    return (g.float() * v.float()).to(v.dtype), None
