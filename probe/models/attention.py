"""One attention module for every inside-a-head mechanism (SPEC §4, abstention-filtering §3, gatedv.md).

Routing side: baseline softmax, a phantom key (off-by-one: logit 0; sink logit: learned b_h), or the
routing-slot control (log g_j added to the logits). Value side: norm gate, projection gate, GatedV SiLU and its
controls (V⊙tanh V, headwise G2 gate, GLU value), value residual. The maths lives in probe.kernels; this module
wires parameters and hook points. With no hook attached the fused/SDPA path runs and nothing T×T is stored.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformer_lens.hook_points import HookPoint

from probe.kernels import sink_attention, value_transform
from probe.models.config import ProbeConfig
from probe.models.layers import RMSNorm, Rotary, project_with_key

# value gates that are a pure function of the read v_j (the kernel can fuse them into the V load)
KERNEL_TRANSFORMS = {"none": "identity", "norm": "norm", "proj": "proj", "routing-norm": "routing-norm",
                     "silu": "silu", "tanh": "tanh"}


def initial_read_norm(config: ProbeConfig) -> float:
    """Expected ‖v_j‖/√dh of the initial model: the default norm-gate threshold τ_h.

    The input of W_V is normalised (unit RMS per coordinate), so each coordinate of v has the standard
    deviation of W_V's entries times √d_model. Placing τ there opens half the gate at init (abstention-filtering
    leaves τ's init unspecified; SPEC §4 suggests the median read norm of the initial model)."""
    std = 0.02 if config.init == "gpt2" else 1 / math.sqrt(config.d_model)
    return std * math.sqrt(config.d_model)


class Attention(nn.Module):
    def __init__(self, config: ProbeConfig, layer: int, key_rank: int = 0):
        super().__init__()
        c = config
        self.layer, self.n_heads, self.n_kv, self.d_head, self.d_value = layer, c.n_heads, c.n_kv_heads, c.d_head, c.d_value
        self.gate_kind, self.abstention, self.backend, self.beta = c.value_gate, c.abstention, c.backend, c.gate_beta
        self.qk_activation = c.qk_activation
        self.q_proj = nn.Linear(c.d_model, c.n_heads * c.d_head, bias=False)
        self.k_proj = nn.Linear(c.d_model, c.n_kv_heads * c.d_head, bias=False)
        self.v_proj = nn.Linear(c.d_model, c.n_kv_heads * c.d_value, bias=False)
        self.o_proj = nn.Linear(c.n_heads * c.d_value, c.d_model, bias=False)
        self.key_proj = nn.Linear(c.n_heads * c.d_value, key_rank, bias=False) if key_rank else None  # P-LR key rows
        self.q_norm = RMSNorm(c.d_head, c.norm_eps) if c.qk_norm else None
        self.k_norm = RMSNorm(c.d_head, c.norm_eps) if c.qk_norm else None
        self.rotary = Rotary(c.d_head, c.rope_theta) if c.pos == "rope" else None

        if c.abstention == "sinklogit":
            self.sink = nn.Parameter(torch.zeros(c.n_heads))  # b_h, init 0 (= off-by-one at init)
        if c.value_gate in ("norm", "routing-norm"):
            tau = c.gate_tau_init if c.gate_tau_init is not None else initial_read_norm(c)
            self.gate_tau = nn.Parameter(torch.full((c.n_kv_heads,), float(tau)))
        if c.value_gate == "proj":
            self.gate_w = nn.Parameter(torch.zeros(c.n_kv_heads, c.d_value))  # w_h = 0, b_h = 0: g = 1/2 at init
            self.gate_b = nn.Parameter(torch.zeros(c.n_kv_heads))
        if c.value_gate == "g2":  # Gated Attention's G2: headwise sigmoid gate from the block input
            self.g2_proj = nn.Linear(c.d_model, c.n_kv_heads, bias=False)
        if c.value_gate == "glu":  # GLU value: (U W_C) ⊙ SiLU(U W_G)
            self.v_gate_proj = nn.Linear(c.d_model, c.n_kv_heads * c.d_value, bias=False)
        self.value_residual = c.value_residual if layer > 0 else "none"  # layer 0's values are V_1
        if self.value_residual == "lambda":
            self.v_mix = nn.Parameter(torch.full((1,), 0.5))  # λ_n
        elif self.value_residual == "two-weight":
            self.v_mix = nn.Parameter(torch.full((2,), 0.5))  # (λ_{n,1} on V_1, λ_{n,2} on V_n)

        self.hook_q = HookPoint()  # B,T,H,dh
        self.hook_k = HookPoint()  # B,T,Hkv,dh
        self.hook_v = HookPoint()  # B,T,Hkv,dv
        self.hook_v_first = HookPoint()  # B,T,Hkv,dv
        self.hook_v_mix = HookPoint()  # (1,) or (2,)
        self.hook_v_gate = HookPoint()  # B,T,Hkv or B,T,Hkv,dv
        self.hook_v_out = HookPoint()  # B,T,Hkv,dv
        self.hook_sink_logit = HookPoint()  # H
        self.hook_pattern = HookPoint()  # B,H,Tq,Tk
        self.hook_phantom = HookPoint()  # B,H,Tq
        self.hook_z = HookPoint()  # B,T,H,dv

    def _hooked(self, *points: HookPoint) -> bool:
        return any(p.has_hooks() for p in points)

    def forward(self, xq: torch.Tensor, xk: torch.Tensor | None = None, xv: torch.Tensor | None = None,
                v_first: torch.Tensor | None = None):
        """xq/xk/xv: B,T,d normalised inputs (MUDD feeds separate streams; otherwise all equal).
        Returns (output B,T,d, P-LR key B,T,r or None, V_1 for the value residual)."""
        xk = xq if xk is None else xk
        xv = xq if xv is None else xv
        B, T, _ = xq.shape
        q = self.q_proj(xq).view(B, T, self.n_heads, self.d_head)
        k = self.k_proj(xk).view(B, T, self.n_kv, self.d_head)
        v = self.v_proj(xv).view(B, T, self.n_kv, self.d_value)
        if self.qk_activation != "none":  # GatedV placement controls, applied before RoPE
            q = F.silu(q)
            k = F.silu(k) if self.qk_activation == "qk" else k
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rotary is not None:
            q, k = self.rotary(q), self.rotary(k)
        q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)

        if self.value_residual == "none":
            v_first = v if self.layer == 0 else v_first
        else:
            v_first = self.hook_v_first(v_first)
            lam = self.hook_v_mix(self.v_mix)
            v = (1 - lam) * v + lam * v_first if lam.numel() == 1 else lam[1] * v + lam[0] * v_first

        sink = None
        if self.abstention == "sinklogit":
            sink = self.hook_sink_logit(self.sink)
        elif self.abstention == "offbyone":
            sink = self.hook_sink_logit(q.new_zeros(self.n_heads, dtype=torch.float32))

        need_pattern = self._hooked(self.hook_pattern, self.hook_phantom)
        gate_params = dict(tau=getattr(self, "gate_tau", None), w=getattr(self, "gate_w", None),
                           b=getattr(self, "gate_b", None), beta=self.beta)
        kind = KERNEL_TRANSFORMS.get(self.gate_kind)
        key_bias = None
        if kind is not None and not need_pattern and not self._hooked(self.hook_v_gate, self.hook_v_out):
            # fast path: the value transform is fused into the attention op (Triton) or done just before SDPA
            res = sink_attention(q, k, v, sink=sink, transform=kind, backend=self.backend, **gate_params)
        else:
            # hooked path: gate, aggregated value and pattern are materialised so hooks can read and edit them
            gate = self._gate(v, xv, kind, gate_params)
            v_out = v
            if gate is not None:
                gate = self.hook_v_gate(gate)
                if self.gate_kind == "routing-norm":  # routing slot: log g_j on the logits, values unchanged
                    key_bias = torch.log(gate.float().clamp_min(1e-30)).permute(0, 2, 1)  # B,Hkv,T
                else:  # every value-slot gate multiplies the read: scalar per head or element-wise
                    g = gate.float() if gate.dim() == v.dim() else gate.float()[..., None]
                    v_out = (g * v.float()).to(v.dtype)
            v_out = self.hook_v_out(v_out)
            res = sink_attention(q, k, v_out, sink=sink, key_bias=key_bias, return_pattern=need_pattern,
                                 backend="torch" if need_pattern else self.backend)
            if need_pattern:
                self.hook_pattern(res.pattern)
                self.hook_phantom(res.phantom)
        z = self.hook_z(res.out)  # B,T,H,dv
        z = z.reshape(B, T, self.n_heads * self.d_value)
        out, key = project_with_key(z, self.o_proj, self.key_proj)  # B,T,d and B,T,r (P-LR) or None
        return out, key, v_first

    def _gate(self, v, xv, kind, gate_params):
        """The gate g of the read (B,T,Hkv scalar or B,T,Hkv,dv element-wise), or None for ungated heads."""
        if self.gate_kind == "g2":
            return torch.sigmoid(self.g2_proj(xv).float())
        if self.gate_kind == "glu":
            B, T = v.shape[:2]
            return F.silu(self.v_gate_proj(xv).float()).view(B, T, self.n_kv, self.d_value)
        return value_transform(v, kind, **gate_params)[1]
