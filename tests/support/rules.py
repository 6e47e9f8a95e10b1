"""What the row-rule tests share: fp64 GQA inputs with a key bias, and the gradients of an attention op under its
fused and its reference backend."""

from __future__ import annotations

import torch

BACKENDS = ("torch", "reference")


def gradients_by_backend(attention, seed: int = 1, **kw) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(fused, reference) gradient pairs of q, k, v for sum(out * w) of ``attention(q, k, v, backend=..., **kw)``, on
    fp64 GQA inputs (B=2, T=6, 4 query heads over 2 KV heads, d=8) drawn from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 6, 4, 8, generator=g, dtype=torch.float64) * 2 for _ in range(3))
    k, v = k[:, :, :2], v[:, :, :2]  # GQA: two query heads per KV head
    w = torch.randn(2, 6, 4, 8, generator=g, dtype=torch.float64)
    grads = []
    for backend in BACKENDS:
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out = attention(*leaves, backend=backend, **kw).out
        grads.append(torch.autograd.grad((out * w).sum(), leaves))
    return list(zip(*grads))


def out_and_grads(rule, inputs, **kw):
    """A row rule's output and the gradients of sum(out * w) (w: a linspace over every entry) in q, k, v and the key
    bias of ``inputs`` (gqa_inputs); ``kw`` for the op (return_pattern, backend)."""
    q, k, v, key_bias = inputs
    out = rule.attention(q, k, v, bias=rule.bias(16), key_bias=key_bias, **kw).out
    weights = torch.linspace(-1.0, 1.0, out.numel(), dtype=out.dtype).view_as(out)  # a loss that weighs every entry
    return out, torch.autograd.grad((out * weights).sum(), inputs)


def gqa_inputs(Tq: int, Tk: int, seed: int = 0):
    """fp64 leaves q (2,Tq,4,8), k and v (2,Tk,2,8) (two query heads per KV head), key_bias (2,2,Tk), from seed."""
    g = torch.Generator().manual_seed(seed)
    B, H, Hkv, dh = 2, 4, 2, 8
    q = torch.randn(B, Tq, H, dh, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(B, Tk, Hkv, dh, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(B, Tk, Hkv, dh, generator=g, dtype=torch.float64, requires_grad=True)
    key_bias = torch.randn(B, Hkv, Tk, generator=g, dtype=torch.float64, requires_grad=True)
    return q, k, v, key_bias
