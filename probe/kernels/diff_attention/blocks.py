"""Differential attention in causal blocks of queries, as one autograd function: the CPU training path.

Why not the fused flash kernel: each head's two maps read values of 2·dh, and torch's CPU flash kernel takes q, k and v
of one head size, so the flash path pads each branch's q and k to 2·dh (the score product doubles) and adds
o1 - λ o2 after two calls. Here both branches' softmax rows are built per block of queries, over the keys the block
sees (probe.kernels.causal_blocks), combined into the net row a = p1 - λ p2, and applied to the values once: no
padding, and one value product per head rather than one per branch (docs/results/benchmarks.md).

    forward   s_b = scale q_b k_bᵀ (hidden keys -inf)   p_b = softmax(s_b)   a = p1 - λ p2   out = a v
    backward  dv += aᵀ dout   da = dout vᵀ   dλ -= Σ da ∘ p2
              ds1 = p1 ∘ (da - Σ_j da ∘ p1)   ds2 = -λ p2 ∘ (da - Σ_j da ∘ p2)
              dq_b = scale ds_b k_b   dk_b += scale ds_bᵀ q_b

It keeps each block's p1, p2 and a for the backward: 3 B·H·(about Tq·Tk/2) floats, which the dispatch bounds
(``SAVED_BYTES``); past it, and wherever nothing needs a gradient, the flash path runs instead.
"""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from probe.kernels.causal_blocks import block_scores, heads_first
from probe.kernels.common import first_order_only, wide_dtype

QUERY_BLOCK = 64  # queries per block: 32 and 128 measured slower at B 16, T 256 (one thread)


def saved_floats(q: torch.Tensor, k: torch.Tensor, block: int = QUERY_BLOCK) -> int:
    """How many floats the forward keeps for q (B,Tq,2H,dh), k (B,Tk,2Hkv,dh): p1, p2 and a over each block's keys."""
    B, Tq, H2 = q.shape[:3]
    Tk = k.shape[1]
    rows = sum(min(block, Tq - a) * (Tk - Tq + min(Tq, a + block)) for a in range(0, Tq, block))
    return 3 * B * (H2 // 2) * rows


def _branches_first(x: torch.Tensor, G: int) -> torch.Tensor:
    """x (B,T,2h,d) branch-major -> (2,B,h·G,T,d), contiguous, wide (each head repeated G times: GQA)."""
    B, T, hx, d = x.shape
    y = x.view(B, T, 2, hx // 2, d).permute(2, 0, 3, 1, 4)  # 2,B,h,T,d
    if G > 1:
        y = y.repeat_interleave(G, dim=2)
    return torch.empty(y.shape, dtype=wide_dtype(x.dtype), device=x.device).copy_(y)


def _rows(qf, kf, lam_f, block: int) -> list:
    """Per block of ``block`` queries (first query, keys seen, both branches' rows (2,B,H,b,n), net rows (B,H,b,n)).
    qf (2,B,H,Tq,dh) scaled, kf (2,B,H,Tk,dh), lam_f (1,H,1,1)."""
    _, B, H, Tq, dh = qf.shape
    Tk = kf.shape[3]
    q3, k3 = qf.view(2 * B * H, Tq, dh), kf.view(2 * B * H, Tk, dh)
    kept = []
    for a in range(0, Tq, block):
        n = Tk - Tq + min(Tq, a + block)  # keys up to the block's last query
        s = block_scores(q3[:, a : a + block], k3[:, :n], None)  # 2BH,b,n
        p = torch.softmax(s, -1).view(2, B, H, s.shape[1], n)
        kept.append((a, n, p, torch.addcmul(p[0], p[1], lam_f, value=-1.0)))  # net rows p1 - λ p2
    return kept


class _DiffBlocks(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, lam, scale: float, block: int):
        # q (B,Tq,2H,dh), k (B,Tk,2Hkv,dh) branch-major, v (B,Tk,Hkv,dv), λ (H,)
        B, Tq, H = q.shape[0], q.shape[1], q.shape[2] // 2
        Tk, G = k.shape[1], H // (k.shape[2] // 2)
        qf = _branches_first(q, 1).mul_(scale)  # 2,B,H,Tq,dh, scaled once
        kf = _branches_first(k, G)  # 2,B,H,Tk,dh
        vf = heads_first(v, G)  # B,H,Tk,dv
        lam_f = lam.to(qf.dtype)[None, :, None, None]  # 1,H,1,1
        out = qf.new_empty(B, H, Tq, vf.shape[-1])  # B,H,Tq,dv
        out3, v3 = out.view(B * H, Tq, -1), vf.view(B * H, Tk, -1)  # the products write into out's rows
        kept = _rows(qf, kf, lam_f, block)
        for a, n, p, net in kept:
            b = p.shape[3]
            torch.bmm(net.view(B * H, b, n), v3[:, :n], out=out3[:, a : a + b])
        ctx.kept, ctx.scale, ctx.G, ctx.block = kept, scale, G, block
        ctx.dtypes = (q.dtype, k.dtype, v.dtype, lam.dtype)
        ctx.save_for_backward(qf, kf, vf, lam_f)
        return out.transpose(1, 2).to(q.dtype)  # B,Tq,H,dv

    @staticmethod
    @first_order_only
    @once_differentiable
    def backward(ctx, dout):
        qf, kf, vf, lam_f = ctx.saved_tensors
        _, B, H, Tq, dh = qf.shape
        Tk = kf.shape[3]
        dof = dout.to(qf.dtype).transpose(1, 2)  # B,H,Tq,dv
        dq, dk, dv = torch.empty_like(qf), torch.empty_like(kf), torch.empty_like(vf)
        dlam = qf.new_zeros(H)
        q3, k3, v3 = qf.view(2 * B * H, Tq, dh), kf.view(2 * B * H, Tk, dh), vf.view(B * H, Tk, -1)
        dq3, dk3, dv3 = dq.view(2 * B * H, Tq, dh), dk.view(2 * B * H, Tk, dh), dv.view(B * H, Tk, -1)
        softmax_backward = torch.ops.aten._softmax_backward_data.out
        # the rows are taken by the first backward; a second one, under retain_graph=True (a Jacobian, a
        # sensitivity), builds them again from the kept q, k and λ
        kept = ctx.kept if ctx.kept is not None else _rows(qf, kf, lam_f, ctx.block)
        ctx.kept = None
        # the last block first: it sees every key, so its products write dk and dv whole, and the others add to them
        for i, (a, n, p, net) in enumerate(reversed(kept)):
            b = p.shape[3]
            do3 = dof[:, :, a : a + b].reshape(B * H, b, -1)
            dv_b = torch.bmm(net.view(B * H, b, n).transpose(1, 2), do3, out=dv3 if i == 0 else None)  # aᵀ dout
            da = torch.bmm(do3, v3[:, :n].transpose(1, 2)).view(B, H, b, n)  # dL/da
            dlam.sub_((da * p[1]).sum((0, 2, 3)))
            ds = torch.empty_like(p)  # 2,B,H,b,n
            softmax_backward(da, p[0], -1, p.dtype, grad_input=ds[0])
            softmax_backward(da, p[1], -1, p.dtype, grad_input=ds[1]).mul_(-lam_f)
            ds3 = ds.view(2 * B * H, b, n)
            torch.bmm(ds3, k3[:, :n], out=dq3[:, a : a + b]).mul_(ctx.scale)
            dk_b = torch.bmm(ds3.transpose(1, 2), q3[:, a : a + b], out=dk3 if i == 0 else None)  # dsᵀ q; q scaled
            if i:
                dv3[:, :n].add_(dv_b)
                dk3[:, :n].add_(dk_b)
        G = ctx.G
        q_t, k_t, v_t, lam_t = ctx.dtypes
        dq = dq.permute(1, 3, 0, 2, 4).reshape(B, Tq, 2 * H, dh)  # branch-major heads again
        if G > 1:  # each kv head's G query heads
            dk, dv = dk.view(2, B, H // G, G, Tk, dh).sum(3), dv.view(B, H // G, G, Tk, -1).sum(2)
        dk = dk.view(2, B, H // G, Tk, dh).permute(1, 3, 0, 2, 4).reshape(B, Tk, 2 * (H // G), dh)
        dv = dv.transpose(1, 2)  # B,Tk,Hkv,dv
        return dq.to(q_t), dk.to(k_t), dv.to(v_t), dlam.to(lam_t), None, None


def diff_attention_blocks(q, k, v, lam, *, scale=None, block: int = QUERY_BLOCK) -> torch.Tensor:
    """out (B,Tq,H,dv) in q's dtype: Σ_j (p1 - λ p2)_ij v_j over causal rows (queries the last Tq of the Tk positions),
    in blocks of ``block`` queries; q (B,Tq,2H,dh), k (B,Tk,2Hkv,dh) branch-major, v (B,Tk,Hkv,dv), λ (H,); scale
    1/sqrt(dh) by default. Differentiable in q, k, v and λ (once)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    return _DiffBlocks.apply(q, k, v, lam, scale, block)
