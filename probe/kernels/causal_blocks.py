"""Causal attention under a materialising row rule, in blocks of queries, as one autograd function.

Queries a .. a + b - 1 (positions off + a ..) take the scores over keys 0 .. off + a + b - 1, the ones the block's
last query can see; the keys after them are hidden under every rule here (weight 0, no term in a row sum), so the
masked upper triangle is never built and each T x T pass shrinks to about (1 + 1/n_blocks) / 2 of the square.

Why one function rather than autograd through the blocks: autograd through ``k[:, :n]`` and ``torch.cat`` gives each
block a slice node whose backward writes a zero (B, Tk, ...) buffer and copies into it, and a cast and transpose node
per tensor; at the tiny tier these cost as much as the rule. Here the forward keeps each block's rule graph
(scores -> weights, the rule's own fused backward) and the backward runs it per block and adds dq, dk, dv (and the
key bias's gradient) into buffers in place:

    s = scale q k^T + key_bias (hidden keys -inf)   w = rule(s)   out = w v
    dv += w^T dout   dw = dout v^T   ds = rule'(dw)   dq = scale ds k   dk += scale ds^T q   d key_bias += sum_i ds

GQA: query head h reads kv head h // G; the key and value gradients sum over each kv head's G query heads.
Values are the unblocked ones up to summation order (tests/kernels/test_rule_attention.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch.autograd.function import once_differentiable

from probe.kernels.common import first_order_only, wide, wide_dtype

OfScores = Callable[[torch.Tensor], torch.Tensor]  # scores (B,H,b,n), hidden keys -inf -> weights (B,H,b,n)


def block_scores(qb, k_rep, key_bias_rep) -> torch.Tensor:
    """scores (B,H,b,n) of the queries at positions n - b .. n - 1 over keys 0 .. n - 1, hidden keys -inf.
    qb (B,H,b,dh) already scaled, k_rep (B,H,n,dh) (or both with any leading dims), key_bias_rep (B,H,n) or None.
    Only the last b keys can be hidden (every query sees keys 0 .. n - b), so the mask touches those columns alone."""
    b, n = qb.shape[-2], k_rep.shape[-2]
    s = qb @ k_rep.transpose(-1, -2)  # B,H,b,n
    if key_bias_rep is not None:
        s.add_(key_bias_rep[:, :, None, :])
    tail = s[..., n - b :]  # B,H,b,b: key n - b + j is hidden from query i where j > i
    tail.masked_fill_(torch.ones(b, b, dtype=torch.bool, device=s.device).triu_(1), float("-inf"))
    return s


def _rule_graphs(qf, kf, bias, of_scores: OfScores, block: int) -> list:
    """Per block of ``block`` queries (first query, keys seen, scores leaf (B,H,b,n), weights (B,H,b,n)): the rule's
    graph from the scores to the weights, for the backward. qf (B,H,Tq,dh) scaled, kf (B,H,Tk,dh), bias (B,H,Tk)."""
    Tq, Tk = qf.shape[2], kf.shape[2]
    graphs = []
    for a in range(0, Tq, block):
        n = Tk - Tq + min(Tq, a + block)  # keys up to the block's last query
        s = block_scores(qf[:, :, a : a + block], kf[:, :, :n], None if bias is None else bias[..., :n])  # B,H,b,n
        with torch.enable_grad():  # the rule's graph only: s is its leaf
            w = of_scores(s.requires_grad_())  # B,H,b,n
        graphs.append((a, n, s, w))
    return graphs


class _CausalBlocks(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, key_bias, of_scores: OfScores, scale: float, block: int):
        # q (B,Tq,H,dh), k (B,Tk,Hkv,dh), v (B,Tk,Hkv,dv), key_bias (B,Hkv,Tk) or None
        B, Tq, H, _ = q.shape
        Tk, Hkv = k.shape[1], k.shape[2]
        G = H // Hkv
        qf = heads_first(q, 1).mul_(scale)  # B,H,Tq,dh, scaled once rather than every block's scores
        kf, vf = heads_first(k, G), heads_first(v, G)  # B,H,Tk,dh; B,H,Tk,dv
        bias = None if key_bias is None else wide(key_bias).repeat_interleave(G, dim=1)  # B,H,Tk
        out = qf.new_empty(qf.shape[:3] + vf.shape[-1:])  # B,H,Tq,dv
        out3, v3 = out.view(B * H, Tq, -1), vf.view(B * H, Tk, -1)  # the products write into out's rows
        graphs = _rule_graphs(qf, kf, bias, of_scores, block)
        for a, n, _, w in graphs:
            torch.bmm(w.detach().reshape(B * H, -1, n), v3[:, :n], out=out3[:, a : a + block])
        ctx.graphs, ctx.of_scores, ctx.block = graphs, of_scores, block
        ctx.scale, ctx.G, ctx.has_bias = scale, G, key_bias is not None
        ctx.dtypes = (q.dtype, k.dtype, v.dtype, None if key_bias is None else key_bias.dtype)
        ctx.save_for_backward(qf, kf, vf, bias)
        return out.transpose(1, 2).to(q.dtype)  # B,Tq,H,dv

    @staticmethod
    @first_order_only
    @once_differentiable
    def backward(ctx, dout):
        qf, kf, vf, bias = ctx.saved_tensors
        # the rule's graphs are taken by the first backward (each block's runs once); a second one, under
        # retain_graph=True (a Jacobian, a sensitivity), builds them again from the kept q, k and bias
        graphs = ctx.graphs if ctx.graphs is not None else _rule_graphs(qf, kf, bias, ctx.of_scores, ctx.block)
        ctx.graphs = None
        B, H, Tq, Tk = qf.shape[0], qf.shape[1], qf.shape[2], kf.shape[2]
        dof = wide(dout).transpose(1, 2)  # B,H,Tq,dv
        dq, dk, dv = torch.empty_like(qf), torch.empty_like(kf), torch.empty_like(vf)  # each query in one block
        dq3, dk3, dv3 = dq.view(B * H, Tq, -1), dk.view(B * H, Tk, -1), dv.view(B * H, Tk, -1)
        q3, k3 = qf.view(B * H, Tq, -1), kf.view(B * H, Tk, -1)
        dbias = qf.new_zeros(kf.shape[:3]) if ctx.has_bias else None  # B,H,Tk
        # the last block first: it sees every key, so its products write dk and dv whole, and the others add to them
        for i, (a, n, s, w) in enumerate(reversed(graphs)):
            b = s.shape[2]
            do_b = dof[:, :, a : a + b]  # B,H,b,dv
            w3 = w.detach().reshape(B * H, b, n)
            dv_b = torch.bmm(w3.transpose(-1, -2), do_b.reshape(B * H, b, -1), out=None if i else dv3)  # w^T dout
            (ds,) = torch.autograd.grad(w, s, do_b @ vf[:, :, :n].transpose(-1, -2))  # B,H,b,n
            if dbias is not None:
                dbias[:, :, :n].add_(ds.sum(-2))
            ds3 = ds.reshape(B * H, b, n)
            torch.bmm(ds3, k3[:, :n], out=dq3[:, a : a + b]).mul_(ctx.scale)
            dk_b = torch.bmm(ds3.transpose(-1, -2), q3[:, a : a + b], out=None if i else dk3)  # ds^T q; qf is scaled
            if i:  # (baddbmm_ into these strided views would run one addmm per matrix)
                dv3[:, :n].add_(dv_b)
                dk3[:, :n].add_(dk_b)
        G = ctx.G
        q_t, k_t, v_t, bias_t = ctx.dtypes
        if G > 1:  # each kv head's G query heads
            dk, dv = dk.view(B, H // G, G, *dk.shape[2:]).sum(2), dv.view(B, H // G, G, *dv.shape[2:]).sum(2)
            dbias = None if dbias is None else dbias.view(B, H // G, G, -1).sum(2)
        dk, dv = dk.transpose(1, 2).to(k_t), dv.transpose(1, 2).to(v_t)  # B,Tk,Hkv,dh; B,Tk,Hkv,dv
        dbias = None if dbias is None else dbias.to(bias_t)  # B,Hkv,Tk
        return dq.transpose(1, 2).to(q_t), dk, dv, dbias, None, None, None


def heads_first(x: torch.Tensor, G: int) -> torch.Tensor:
    """x (B,T,h,d) -> (B,h·G,T,d), contiguous, wide (each head repeated G times: GQA); a new tensor."""
    B, T, h, d = x.shape
    if G == 1:  # one copy, transposing and widening at once
        return torch.empty(B, h, T, d, dtype=wide_dtype(x.dtype), device=x.device).copy_(x.transpose(1, 2))
    return wide(x).transpose(1, 2).repeat_interleave(G, dim=1)


def causal_blocks(q, k, v, of_scores: OfScores, *, key_bias=None, scale=None, block: int = 64) -> torch.Tensor:
    """out (B,Tq,H,dv) in q's dtype of causal rows under ``of_scores`` (queries the last Tq of the Tk positions), in
    blocks of ``block`` queries; q (B,Tq,H,dh), k (B,Tk,Hkv,dh), v (B,Tk,Hkv,dv), key_bias (B,Hkv,Tk) or None;
    scale 1/sqrt(dh) by default. Differentiable in q, k, v and key_bias (once)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    return _CausalBlocks.apply(q, k, v, key_bias, of_scores, scale, block)
