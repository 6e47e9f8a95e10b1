"""Inputs and explicit fp64 softmaxes shared by the attention ops' tests (the naive side of each comparison)."""

import math

import torch

from probe.kernels.sink_attention.reference import attention_probs
from tests.kernels.interpreter import DEV, leaf

SINKS = [None, float("-inf"), 0.0, 100.0, -100.0]


def rand_qkv(B=2, T=6, H=4, Hkv=2, dh=8, dv=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(B, T, H, dh, generator=g),
        torch.randn(B, T, Hkv, dh, generator=g),
        torch.randn(B, T, Hkv, dv, generator=g),
    )


def naive_attention(q, k, v, *, sink=None, key_bias=None, window=None, log_gate=None, softcap=None):
    """Row by row in float64 with Python exp: the phantom enters the normaliser with value 0. softcap bends the q.k
    score only (Gemma 2: cap tanh(s / cap)); biases and the sink are added uncapped."""
    B, T, H, dh = q.shape
    G = H // k.shape[2]
    out = torch.zeros(B, T, H, v.shape[-1], dtype=torch.float64)
    pattern = torch.zeros(B, H, T, T, dtype=torch.float64)
    phantom = torch.zeros(B, H, T, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                js = [j for j in range(T) if j <= i and (window is None or j > i - window)]
                logit = {j: float(q[b, i, h].double() @ k[b, j, h // G].double()) / math.sqrt(dh) for j in js}
                if softcap is not None:
                    logit = {j: softcap * math.tanh(x / softcap) for j, x in logit.items()}
                for j in js:
                    logit[j] += 0.0 if key_bias is None else float(key_bias[b, h // G, j])
                    logit[j] += 0.0 if log_gate is None else float(log_gate[b, j, h // G])
                top = max(list(logit.values()) + ([float(sink[h])] if sink is not None else []))
                z = sum(math.exp(x - top) for x in logit.values())
                z += math.exp(float(sink[h]) - top) if sink is not None else 0.0
                for j in js:
                    pattern[b, h, i, j] = math.exp(logit[j] - top) / z
                    out[b, i, h] += pattern[b, h, i, j] * v[b, j, h // G].double()
                phantom[b, h, i] = math.exp(float(sink[h]) - top) / z if sink is not None else 0.0
    return out, pattern, phantom


def inputs(B=2, T=7, H=4, Hkv=2, dh=8, dv=6, sink_value=None, key_bias=False, seed=0):
    """q, k, v, the value gates' parameters (tau, w, b), mixed per-head sinks around ``sink_value`` and a key bias:
    leaves on DEV."""
    g = torch.Generator().manual_seed(seed)
    x = dict(
        q=leaf(g, B, T, H, dh),
        k=leaf(g, B, T, Hkv, dh),
        v=leaf(g, B, T, Hkv, dv),
        tau=(0.5 + 0.3 * torch.randn(Hkv, generator=g)).to(DEV).requires_grad_(),
        w=leaf(g, Hkv, dv),
        b=leaf(g, Hkv),
    )
    if sink_value is not None:
        x["sink"] = torch.tensor(([sink_value, 0.3, -2.0, sink_value] * H)[:H]).to(DEV).requires_grad_()
    if key_bias:
        x["key_bias"] = leaf(g, B, Hkv, T)
    return x


def real_lse(q, k, **kw):
    """fp64 log Σ_visible exp(score), no phantom: attention_probs without a sink."""
    return attention_probs(
        q.double(), k.double(), **{a: (b.double() if torch.is_tensor(b) else b) for a, b in kw.items()}
    )[2]
