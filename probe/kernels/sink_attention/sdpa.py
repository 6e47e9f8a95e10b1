"""Fused torch path (no pattern): SDPA with the phantom key folded in.

Causal attention with a sink and nothing else on the CPU runs the flash kernel as it is and rescales its rows
(`_CausalSinkFlashCPU`). Everything else (key biases, windows, masks, other devices) uses extra coordinates:

The trick (Wang 2026, App. "Implementation of the variants"), adapted to per-query-head sinks under GQA:

    coordinate  query (per query head h)   phantom key   real key j
    sink        sink_h / scale             1             0            -> phantom logit = sink_h, real logits unchanged
    bias        1 / scale                  0             key_bias_j   -> real logit += key_bias_j

The phantom key is prepended at position 0 with value 0. Without a window a dummy query row is prepended too, so the
(T+1) x (T+1) problem is plain causal (`is_causal=True`) and query i (now at i+1) sees the phantom and keys <= i. A
caller's additive mask (HF padding) or fewer queries than keys (a cache) use an explicit (Tq, Tk+1) mask instead. A
window (with or without kept first keys) runs in blocks of ``QUERY_BLOCK`` queries, each over the keys its rule can see
(the kept first keys and the block's window) with a block x keys mask: nothing Tq x Tk, memory O(T).
Head sizes are zero-padded to one multiple of 8 so that q, k and v share it, which is what the fused CPU kernel needs
(otherwise SDPA falls back to the slow math path).
Everything stays differentiable w.r.t. q, k, v, sink and key_bias (and so w.r.t. whatever computed them: value gates).
Precision: the extra coordinates are in q.dtype (exact enough in fp32). In bf16 / fp16 the key bias is carried by
``HALF_BIAS_PARTS`` coordinates whose parts, each exact in q.dtype, sum to it in the kernel's fp32 products: a large
bias (FoX's -c_j grows with the position) keeps about fp32 precision instead of 8 or 11 bits; a sink logit is rounded.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from probe.kernels.common import cpu_flash, first_order_only, pad_last
from probe.kernels.sink_attention.reference import visible_mask

QUERY_BLOCK = 256  # queries per block of the windowed path: a block's mask is 256 x (kept + 256 + window - 1) keys
HALF_BIAS_PARTS = 3  # bf16 / fp16 parts of a key bias: 3 x 8 bits ~ the 24 of fp32
SINK_FLOOR = -1000.0  # sinks below this are clamped: exp(-1000 - lse) is 0 in fp32, and -inf * 0 would give NaN


def fused_sdpa(q, k, v, *, is_causal, mask, scale):
    """q (B,H,Tq,D), k/v (B,Hkv,Tk,D) -> (out (B,H,Tq,D), lse (B,H,Tq) or None). GQA handled by the kernel."""
    if q.device.type == "cpu" and cpu_flash is not None:
        return cpu_flash(q, k, v, 0.0, is_causal, attn_mask=mask, scale=scale)
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=q.shape[1] != k.shape[1]
    )
    return out, None


def bias_coordinates(key_bias: torch.Tensor, scale: float, dtype: torch.dtype) -> tuple[float, list[torch.Tensor]]:
    """(u, parts): query coordinates u and key coordinates parts (each (B,Hkv,Tk), fp32 or fp64) with
    scale · u · Σ parts = key_bias, every value exact in ``dtype``. fp32 / fp64: u = 1/scale and the bias itself; bf16
    / fp16: u a power of two near 1/scale and ``HALF_BIAS_PARTS`` parts, each the rounding of what the earlier ones
    left, so the kernel's fp32 sum over coordinates restores the bias to ~fp32 precision. Autograd gives the bias the
    first part's gradient (the later parts' dependence on it cancels): the exact one."""
    if dtype in (torch.float32, torch.float64):
        return 1.0 / scale, [key_bias.to(dtype)]
    unit = 2.0 ** round(math.log2(1.0 / scale))  # exact in every float dtype
    rest, parts = key_bias.float() / (scale * unit), []
    for _ in range(HALF_BIAS_PARTS):
        parts.append(rest.to(dtype).float())
        rest = rest - parts[-1]
    return unit, parts


class _CausalSinkFlashCPU(torch.autograd.Function):
    """Causal attention with a per-head phantom (logit ``sink``, value 0) on the fused CPU flash kernel, no copies.

    The phantom only rescales each row: y = out · exp(lse − lse'), with lse' = logaddexp(lse, sink) the normaliser
    including it. The kernel's own backward is exact for the phantom problem when given y and lse' (its row term
    rowsum(dy ∘ y) is the phantom-inclusive one, and it rebuilds the real probabilities from lse'); the sink's
    gradient is −Σ_rows p_phantom · rowsum(dy ∘ y).
    """

    @staticmethod
    def forward(ctx, q, k, v, sink, scale):
        # q (B,H,T,D), k/v (B,Hkv,T,D), sink (H,) fp32 -> y (B,H,T,D), lse' (B,H,T), lse over the real keys (B,H,T)
        out, lse = cpu_flash(q, k, v, 0.0, True, scale=scale)
        lse_all = torch.logaddexp(lse, sink.to(lse.dtype)[None, :, None])
        y = (out * torch.exp(lse - lse_all)[..., None].to(out.dtype)).contiguous()
        ctx.save_for_backward(q, k, v, y, lse_all, sink)
        ctx.scale = scale
        ctx.mark_non_differentiable(lse_all, lse)
        return y, lse_all, lse

    @staticmethod
    @first_order_only
    def backward(ctx, dy, _, __):
        q, k, v, y, lse_all, sink = ctx.saved_tensors
        dy = dy.contiguous()
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dy, q, k, v, y, lse_all, 0.0, True, scale=ctx.scale
        )
        p_phantom = torch.exp(sink.to(lse_all.dtype)[None, :, None] - lse_all)  # (B, H, T)
        dsink = -(p_phantom * (dy.float() * y.float()).sum(-1)).sum((0, 2))
        return dq, dk, dv, dsink.to(sink.dtype), None


def sink_attention_sdpa(q, k, v, *, sink=None, key_bias=None, mask=None, window=None, scale=None, keep=None):
    """q (B,Tq,H,dh), k (B,Tk,Hkv,dh), v (B,Tk,Hkv,dv) -> (out (B,Tq,H,dv) in q.dtype, lse (B,H,Tq) fp32 or None,
    lse over the real keys (B,H,Tq) fp32 or None).
    keep: with a window, the first ``keep`` keys stay visible (the kept-first-keys rule).
    A window narrower than the keys runs in query blocks (:func:`windowed_sdpa`); one of at least Tk keys is causal.

    lse comes from the fused CPU kernel, which does not differentiate it: it is returned only when no gradient is
    being recorded (analysis), and is None under autograd or off-CPU. The real-key lse is given by the causal fold,
    which computes it before adding the phantom; elsewhere it is None (without a phantom it is lse itself, and the
    dispatch takes it so; a phantom inside the kernel's lse cannot be taken out without cancellation).
    """
    B, Tq, H, dh = q.shape
    Tk, Hkv, dv = k.shape[1], k.shape[2], v.shape[-1]
    scale = 1.0 / math.sqrt(dh) if scale is None else scale
    if mask is None and window is not None:
        if window < Tk:
            return windowed_sdpa(q, k, v, sink=sink, key_bias=key_bias, window=window, scale=scale, keep=keep)
        window, keep = None, None  # every earlier key is inside the window: causal
    dtype = q.dtype
    recording = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, sink, key_bias))
    causal = mask is None and window is None and Tq == Tk  # plain causal: is_causal, no explicit mask

    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.to(dtype).transpose(1, 2)  # (B, H|Hkv, T, d)
    wide = torch.float64 if dtype == torch.float64 else torch.float32  # sinks and biases: fp32, fp64 in fp64
    if sink is not None and key_bias is None and causal and q.device.type == "cpu" and cpu_flash:
        D = -(-max(dh, dv) // 8) * 8
        s = sink.to(wide).clamp(min=SINK_FLOOR)
        out, lse, real = _CausalSinkFlashCPU.apply(pad_last(qt, D), pad_last(kt, D), pad_last(vt, D), s, scale)
        out = out[..., :dv].transpose(1, 2)
        return (out, None, None) if recording else (out, lse.to(wide), real.to(wide))
    q_extra, k_extra = [], []  # extra coordinates, fp32 (fp64), (B, H, Tq, 1) and (B, Hkv, Tk, 1)
    if sink is not None:
        s = sink.to(wide).clamp(min=SINK_FLOOR) / scale  # (H,)
        q_extra.append(s[None, :, None, None].expand(B, H, Tq, 1))
        k_extra.append(q.new_zeros(B, Hkv, Tk, 1, dtype=wide))
    if key_bias is not None:
        unit, parts = bias_coordinates(key_bias, scale, dtype)
        for part in parts:
            q_extra.append(q.new_full((B, H, Tq, 1), unit, dtype=wide))
            k_extra.append(part[..., None])  # (B, Hkv, Tk, 1)
    D = -(-max(dh + len(q_extra), dv) // 8) * 8  # shared head size, a multiple of 8
    if q_extra:
        qt = torch.cat([qt, torch.cat(q_extra, -1).to(dtype)], -1)
        kt = torch.cat([kt, torch.cat(k_extra, -1).to(dtype)], -1)
    qt, kt, vt = pad_last(qt, D), pad_last(kt, D), pad_last(vt, D)

    if sink is not None:  # prepend the phantom key (1 in the sink coordinate) with value 0
        phantom = q.new_zeros(B, Hkv, 1, D)
        phantom[..., dh] = 1.0
        kt = torch.cat([phantom, kt], 2)  # (B, Hkv, Tk+1, D)
        vt = torch.cat([vt.new_zeros(B, Hkv, 1, D), vt], 2)
    lead = kt.shape[2] - Tk  # 1 with a phantom, else 0

    if causal:
        if lead:
            qt = torch.cat([qt.new_zeros(B, H, 1, D), qt], 2)  # dummy query row keeps is_causal valid
        out, lse = fused_sdpa(qt, kt, vt, is_causal=True, mask=None, scale=scale)
        out, lse = out[:, :, lead:], None if lse is None else lse[:, :, lead:]
    else:
        if mask is None:  # causal over fewer queries than keys (a cache)
            visible = visible_mask(Tq, None, q.device, Tk)
            mask = torch.zeros(Tq, Tk, dtype=dtype, device=q.device).masked_fill(~visible, float("-inf"))
        mask = mask.to(dtype)
        if lead:  # every query sees the phantom
            mask = torch.cat([mask.new_zeros(*mask.shape[:-1], lead), mask], -1)
        out, lse = fused_sdpa(qt, kt, vt, is_causal=False, mask=mask, scale=scale)

    out = out[..., :dv].transpose(1, 2)  # (B, Tq, H, dv)
    lse = None if (lse is None or recording) else lse.to(wide)
    return out, lse, None


def block_keys(rows: slice, off: int, window: int, keep: int | None) -> tuple[int, int, int]:
    """(n_kept, lo, hi): queries ``rows`` (at positions rows + off) see, under the window rule, the first n_kept keys
    and keys lo .. hi-1 (the kept first keys that the window does not already cover, then the block's window)."""
    lo, hi = max(0, rows.start + off - window + 1), rows.stop + off
    return min(keep or 0, lo), lo, hi


def _keys(x, dim: int, n_kept: int, lo: int, hi: int):
    """x's keys 0 .. n_kept-1 and lo .. hi-1 along ``dim`` (a view when there is no kept key to add)."""
    part = x.narrow(dim, lo, hi - lo)
    return part if not n_kept else torch.cat([x.narrow(dim, 0, n_kept), part], dim)


def block_mask(rows: int, n_kept: int, lead: int, n_window: int, n_low: int, window: int, dtype, device):
    """(rows, n_kept + n_window) additive mask of a query block under the window rule: the kept first keys (all
    visible: they precede the block's window and the rule keeps them), then window keys at lead + c relative to the
    block's first query, visible to row r iff 0 <= r - lead - c < window, or r - lead - c >= 0 for the first
    ``n_low`` of them (keys below ``keep``). It depends on these sizes alone: blocks of one shape share it."""
    c = torch.arange(n_window, device=device)
    rel = torch.arange(rows, device=device)[:, None] - lead - c  # query minus key position, (rows, window keys)
    seen = (rel >= 0) & ((rel < window) | (c < n_low))
    visible = torch.cat([seen.new_ones(rows, n_kept), seen], 1)
    return torch.zeros(visible.shape, dtype=dtype, device=device).masked_fill(~visible, float("-inf"))


def windowed_sdpa(q, k, v, *, sink, key_bias, window: int, scale: float, keep=None, block: int | None = None):
    """sink_attention_sdpa under the window rule (key j visible to query i' iff j <= i' and (j > i' - window or
    j < keep)), in blocks of ``block`` queries over the keys each block can see: no Tq x Tk tensor. Same returns."""
    Tq, Tk = q.shape[1], k.shape[1]
    off, block = Tk - Tq, block or QUERY_BLOCK
    outs, lses, masks = [], [], {}
    for a in range(0, Tq, block):
        rows = slice(a, min(Tq, a + block))
        n_kept, lo, hi = block_keys(rows, off, window, keep)
        shape = (rows.stop - rows.start, n_kept, lo - rows.start - off, hi - lo, max(0, min(keep or 0, hi) - lo))
        if shape not in masks:  # the interior blocks of a long sequence all have one shape
            masks[shape] = block_mask(*shape, window, q.dtype, q.device)[None, None]
        span = (n_kept, lo, hi)
        bias = None if key_bias is None else _keys(key_bias, -1, *span)
        out, lse, _ = sink_attention_sdpa(
            q[:, rows],
            _keys(k, 1, *span),
            _keys(v, 1, *span),
            sink=sink,
            key_bias=bias,
            mask=masks[shape],
            scale=scale,
        )
        outs.append(out)
        lses.append(lse)
    lse = None if any(x is None for x in lses) else torch.cat(lses, -1)
    return torch.cat(outs, 1), lse, None
