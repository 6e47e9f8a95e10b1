"""Triton flash-attention for causal attention with a phantom sink key and per-key logit biases (fwd + bwd).

Layout as in the reference: q (B,T,H,dh), k (B,T,Hkv,dh), v (B,T,Hkv,dv); strides are passed, so nothing is transposed.
Online softmax starts from the phantom: m = sink_h, l = 1 (l = 0 when sink_h = -inf), acc = 0 (its value is 0).
Value gates are applied by the model before the kernel (their gradients flow through v and key_bias), so the kernel
only needs: GQA (head h reads kv head h // G), causal + sliding window, sink, key_bias, scale, and the kept-first-keys
rule (``keep``: with a window, keys j < keep stay visible to every later query; their key blocks are visited before
the window's, docs/definitions.md#window-eviction). The forward also takes
Gemma 2's attention-logit soft-cap (s -> cap tanh(s / cap) on scale q.k, before key_bias; a constexpr, so the uncapped
kernel is unchanged) for the row masses; the backward does not (SinkAttentionFunction never passes one).

Backward (FA2 style, no atomics): delta_i = dO_i . O_i - dlse_i;  ds_ij = p_ij (dO_i . v_j - delta_i);
    dv_j = sum_i p_ij dO_i    dk_j = scale sum_i ds_ij q_i    dbias_j = sum_i ds_ij    (one program per key block,
    looping over the G query heads of its kv head)     dq_i = scale sum_j ds_ij k_j   (one program per query block)
    dsink_h = -sum_{b,i} exp(sink_h - lse_i) delta_i   (in PyTorch from lse and delta)

Tiles, warps and stages come from probe.kernels.launch.launch_config for the device's shared memory, chosen once per
call before anything runs (``attention_configs``); when nothing fits it raises NoLaunchConfig and the dispatch takes
the torch path.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from probe.kernels.common import first_order_only
from probe.kernels.launch import KB, NoLaunchConfig, device_limits, launch_config


@triton.jit
def _scores(
    q,
    k,
    bias_ptr,
    rows,
    cols,
    T,
    WINDOW,
    KEEP,
    scale,
    CAP,
    HAS_BIAS: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_KEEP: tl.constexpr,
    HAS_CAP: tl.constexpr,
    PREC: tl.constexpr,
):
    """(BLOCK_M, BLOCK_N) logits cap(scale q.k) + bias, -inf where key col is not visible to query row."""
    s = tl.dot(q, tl.trans(k), input_precision=PREC) * scale
    if HAS_CAP:  # CAP tanh(s / CAP), as 2 sigmoid(2x) - 1: tl has no tanh (libdevice's is CUDA-only)
        s = CAP * (2.0 * tl.sigmoid(2.0 * s / CAP) - 1.0)
    if HAS_BIAS:
        s += tl.load(bias_ptr + cols, mask=cols < T, other=0.0)[None, :]
    visible = (cols[None, :] <= rows[:, None]) & (rows[:, None] < T) & (cols[None, :] < T)
    if HAS_WINDOW:
        in_window = cols[None, :] > rows[:, None] - WINDOW
        if HAS_KEEP:
            in_window |= cols[None, :] < KEEP
        visible &= in_window
    return tl.where(visible, s, float("-inf"))


@triton.jit
def _tile(base, idx, d, s_t, T, D):
    """(len(idx), len(d)) tile of a (T, D) matrix at ``base`` with row stride ``s_t``; zeros past T and D."""
    return tl.load(base + idx[:, None] * s_t + d[None, :], mask=(idx[:, None] < T) & (d[None, :] < D), other=0.0)


@triton.jit
def _query_block(pid_m, pid_bh, H, G, BLOCK_M: tl.constexpr, BLOCK_DH: tl.constexpr, BLOCK_DV: tl.constexpr):
    """A query-block program's batch, query head, kv head (GQA), query rows and head-dim ranges."""
    b, h = pid_bh // H, pid_bh % H
    return b, h, h // G, pid_m * BLOCK_M + tl.arange(0, BLOCK_M), tl.arange(0, BLOCK_DH), tl.arange(0, BLOCK_DV)


@triton.jit
def _key_range(pid_m, T, WINDOW, HAS_WINDOW: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """[lo, hi): the key blocks query block ``pid_m`` can see (causal, and inside the sliding window)."""
    lo = 0
    if HAS_WINDOW:
        lo = tl.maximum(pid_m * BLOCK_M - WINDOW + 1, 0) // BLOCK_N * BLOCK_N
    hi = tl.minimum((pid_m + 1) * BLOCK_M, T)
    return lo, hi


@triton.jit
def _kept_end(lo, KEEP, HAS_KEEP: tl.constexpr, BLOCK_N: tl.constexpr):
    """End of the kept first keys' blocks that lie below the window's first block ``lo`` (0: none to visit)."""
    end = 0
    if HAS_KEEP:
        end = tl.minimum((KEEP + BLOCK_N - 1) // BLOCK_N * BLOCK_N, lo)
    return end


@triton.jit
def _fwd_block(
    q,
    K,
    V,
    BIAS,
    rows,
    start_n,
    d_h,
    d_v,
    m_i,
    l_i,
    acc,
    sk_t,
    sv_t,
    T,
    WINDOW,
    KEEP,
    scale,
    CAP,
    DH,
    DV,
    HAS_BIAS: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_KEEP: tl.constexpr,
    HAS_CAP: tl.constexpr,
    PREC: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """One key block of the online softmax: (m_i, l_i, acc) updated with keys start_n .. start_n + BLOCK_N - 1."""
    cols = start_n + tl.arange(0, BLOCK_N)
    k = _tile(K, cols, d_h, sk_t, T, DH)  # (N, DH)
    v = _tile(V, cols, d_v, sv_t, T, DV)  # (N, DV)
    s = _scores(q, k, BIAS, rows, cols, T, WINDOW, KEEP, scale, CAP, HAS_BIAS, HAS_WINDOW, HAS_KEEP, HAS_CAP, PREC)
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing seen yet stays at 0 mass
    alpha = tl.exp(m_i - m_safe)
    p = tl.exp(s - m_safe[:, None])  # (M, N)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
    return m_new, l_i, acc


@triton.jit
def _dq_block(
    q,
    do,
    K,
    V,
    BIAS,
    rows,
    start_n,
    d_h,
    d_v,
    lse,
    delta,
    dq,
    sk_t,
    sv_t,
    T,
    WINDOW,
    KEEP,
    scale,
    DH,
    DV,
    HAS_BIAS: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_KEEP: tl.constexpr,
    PREC: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """One key block's contribution to dq (unscaled)."""
    cols = start_n + tl.arange(0, BLOCK_N)
    k = _tile(K, cols, d_h, sk_t, T, DH)
    v = _tile(V, cols, d_v, sv_t, T, DV)
    s = _scores(q, k, BIAS, rows, cols, T, WINDOW, KEEP, scale, 0.0, HAS_BIAS, HAS_WINDOW, HAS_KEEP, False, PREC)
    p = tl.exp(s - lse[:, None])
    dp = tl.dot(do, tl.trans(v), input_precision=PREC)
    ds = p * (dp - delta[:, None])
    return dq + tl.dot(ds.to(k.dtype), k, input_precision=PREC)


@triton.jit
def _fwd_kernel(
    Q,
    K,
    V,
    SINK,
    BIAS,
    O,
    LSE,
    sq_b,
    sq_t,
    sq_h,
    sk_b,
    sk_t,
    sk_h,
    sv_b,
    sv_t,
    sv_h,
    so_b,
    so_t,
    so_h,
    sb_b,
    sb_h,
    T,
    H,
    G,
    WINDOW,
    KEEP,
    scale,
    CAP,
    DH,
    DV,
    HAS_SINK: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_KEEP: tl.constexpr,
    HAS_CAP: tl.constexpr,
    PREC: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_DH: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    pid_m, pid_bh = tl.program_id(0), tl.program_id(1)
    b, h, hk, rows, d_h, d_v = _query_block(pid_m, pid_bh, H, G, BLOCK_M, BLOCK_DH, BLOCK_DV)
    q = _tile(Q + b * sq_b + h * sq_h, rows, d_h, sq_t, T, DH)  # (M, DH)
    if HAS_SINK:
        m_i = tl.zeros([BLOCK_M], tl.float32) + tl.load(SINK + h).to(tl.float32)
        l_i = tl.where(m_i == float("-inf"), 0.0, 1.0)  # the phantom's exp(sink - m) = 1
    else:
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)

    lo, hi = _key_range(pid_m, T, WINDOW, HAS_WINDOW, BLOCK_M, BLOCK_N)
    Kb, Vb, Bb = K + b * sk_b + hk * sk_h, V + b * sv_b + hk * sv_h, BIAS + b * sb_b + hk * sb_h
    for start_n in range(0, _kept_end(lo, KEEP, HAS_KEEP, BLOCK_N), BLOCK_N):  # kept first keys below the window
        m_i, l_i, acc = _fwd_block(
            q,
            Kb,
            Vb,
            Bb,
            rows,
            start_n,
            d_h,
            d_v,
            m_i,
            l_i,
            acc,
            sk_t,
            sv_t,
            T,
            WINDOW,
            KEEP,
            scale,
            CAP,
            DH,
            DV,
            HAS_BIAS,
            HAS_WINDOW,
            HAS_KEEP,
            HAS_CAP,
            PREC,
            BLOCK_N,
        )
    for start_n in range(lo, hi, BLOCK_N):
        m_i, l_i, acc = _fwd_block(
            q,
            Kb,
            Vb,
            Bb,
            rows,
            start_n,
            d_h,
            d_v,
            m_i,
            l_i,
            acc,
            sk_t,
            sv_t,
            T,
            WINDOW,
            KEEP,
            scale,
            CAP,
            DH,
            DV,
            HAS_BIAS,
            HAS_WINDOW,
            HAS_KEEP,
            HAS_CAP,
            PREC,
            BLOCK_N,
        )
    l_i = tl.where(l_i == 0.0, 1.0, l_i)  # only padding rows past T see nothing
    out = acc / l_i[:, None]
    tl.store(
        O + b * so_b + h * so_h + rows[:, None] * so_t + d_v[None, :],
        out.to(O.dtype.element_ty),
        mask=(rows[:, None] < T) & (d_v[None, :] < DV),
    )
    tl.store(LSE + pid_bh * T + rows, m_i + tl.log(l_i), mask=rows < T)


@triton.jit
def _bwd_dkdv_kernel(
    Q,
    K,
    V,
    BIAS,
    DO,
    LSE,
    DELTA,
    DK,
    DVAL,
    DBIAS,
    sq_b,
    sq_t,
    sq_h,
    sk_b,
    sk_t,
    sk_h,
    sv_b,
    sv_t,
    sv_h,
    sd_b,
    sd_t,
    sd_h,
    sb_b,
    sb_h,
    sdk_b,
    sdk_t,
    sdk_h,
    sdv_b,
    sdv_t,
    sdv_h,
    T,
    H,
    HKV,
    G,
    WINDOW,
    KEEP,
    scale,
    DH,
    DV,
    HAS_BIAS: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_KEEP: tl.constexpr,
    PREC: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_DH: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    pid_n, pid_bk = tl.program_id(0), tl.program_id(1)
    b, hk = pid_bk // HKV, pid_bk % HKV
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    d_h, d_v = tl.arange(0, BLOCK_DH), tl.arange(0, BLOCK_DV)
    k_mask = (cols[:, None] < T) & (d_h[None, :] < DH)
    v_mask = (cols[:, None] < T) & (d_v[None, :] < DV)
    k = tl.load(K + b * sk_b + hk * sk_h + cols[:, None] * sk_t + d_h[None, :], mask=k_mask, other=0.0)  # (N, DH)
    v = tl.load(V + b * sv_b + hk * sv_h + cols[:, None] * sv_t + d_v[None, :], mask=v_mask, other=0.0)  # (N, DV)
    dk = tl.zeros([BLOCK_N, BLOCK_DH], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], tl.float32)
    db = tl.zeros([BLOCK_N], tl.float32)

    lo = pid_n * BLOCK_N // BLOCK_M * BLOCK_M  # first query that can see this key block (causal)
    hi = T
    if HAS_WINDOW:  # last query that sees key j is j + window - 1
        hi = tl.minimum((pid_n + 1) * BLOCK_N - 1 + WINDOW, T)
        if HAS_KEEP:  # a block holding kept first keys is seen by every later query
            if pid_n * BLOCK_N < KEEP:
                hi = T
    for g in range(G):
        h = hk * G + g
        for start_m in range(lo, hi, BLOCK_M):
            rows = start_m + tl.arange(0, BLOCK_M)
            q = _tile(Q + b * sq_b + h * sq_h, rows, d_h, sq_t, T, DH)  # (M, DH)
            do = _tile(DO + b * sd_b + h * sd_h, rows, d_v, sd_t, T, DV)  # (M, DV)
            lse = tl.load(LSE + (b * H + h) * T + rows, mask=rows < T, other=float("inf"))
            delta = tl.load(DELTA + (b * H + h) * T + rows, mask=rows < T, other=0.0)
            s = _scores(
                q,
                k,
                BIAS + b * sb_b + hk * sb_h,
                rows,
                cols,
                T,
                WINDOW,
                KEEP,
                scale,
                0.0,
                HAS_BIAS,
                HAS_WINDOW,
                HAS_KEEP,
                False,
                PREC,
            )
            p = tl.exp(s - lse[:, None])  # (M, N), 0 where not visible
            dv += tl.dot(tl.trans(p).to(do.dtype), do, input_precision=PREC)
            dp = tl.dot(do, tl.trans(v), input_precision=PREC)
            ds = p * (dp - delta[:, None])
            dk += tl.dot(tl.trans(ds).to(q.dtype), q, input_precision=PREC)
            db += tl.sum(ds, 0)
    tl.store(
        DK + b * sdk_b + hk * sdk_h + cols[:, None] * sdk_t + d_h[None, :],
        (dk * scale).to(DK.dtype.element_ty),
        mask=k_mask,
    )
    tl.store(
        DVAL + b * sdv_b + hk * sdv_h + cols[:, None] * sdv_t + d_v[None, :], dv.to(DVAL.dtype.element_ty), mask=v_mask
    )
    if HAS_BIAS:
        tl.store(DBIAS + pid_bk * T + cols, db, mask=cols < T)


@triton.jit
def _bwd_dq_kernel(
    Q,
    K,
    V,
    BIAS,
    DO,
    LSE,
    DELTA,
    DQ,
    sq_b,
    sq_t,
    sq_h,
    sk_b,
    sk_t,
    sk_h,
    sv_b,
    sv_t,
    sv_h,
    sd_b,
    sd_t,
    sd_h,
    sb_b,
    sb_h,
    sdq_b,
    sdq_t,
    sdq_h,
    T,
    H,
    G,
    WINDOW,
    KEEP,
    scale,
    DH,
    DV,
    HAS_BIAS: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_KEEP: tl.constexpr,
    PREC: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_DH: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    pid_m, pid_bh = tl.program_id(0), tl.program_id(1)
    b, h, hk, rows, d_h, d_v = _query_block(pid_m, pid_bh, H, G, BLOCK_M, BLOCK_DH, BLOCK_DV)
    q_mask = (rows[:, None] < T) & (d_h[None, :] < DH)
    q = _tile(Q + b * sq_b + h * sq_h, rows, d_h, sq_t, T, DH)  # (M, DH)
    do = _tile(DO + b * sd_b + h * sd_h, rows, d_v, sd_t, T, DV)  # (M, DV)
    lse = tl.load(LSE + pid_bh * T + rows, mask=rows < T, other=float("inf"))
    delta = tl.load(DELTA + pid_bh * T + rows, mask=rows < T, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_DH], tl.float32)

    lo, hi = _key_range(pid_m, T, WINDOW, HAS_WINDOW, BLOCK_M, BLOCK_N)
    Kb, Vb, Bb = K + b * sk_b + hk * sk_h, V + b * sv_b + hk * sv_h, BIAS + b * sb_b + hk * sb_h
    for start_n in range(0, _kept_end(lo, KEEP, HAS_KEEP, BLOCK_N), BLOCK_N):  # kept first keys below the window
        dq = _dq_block(
            q,
            do,
            Kb,
            Vb,
            Bb,
            rows,
            start_n,
            d_h,
            d_v,
            lse,
            delta,
            dq,
            sk_t,
            sv_t,
            T,
            WINDOW,
            KEEP,
            scale,
            DH,
            DV,
            HAS_BIAS,
            HAS_WINDOW,
            HAS_KEEP,
            PREC,
            BLOCK_N,
        )
    for start_n in range(lo, hi, BLOCK_N):
        dq = _dq_block(
            q,
            do,
            Kb,
            Vb,
            Bb,
            rows,
            start_n,
            d_h,
            d_v,
            lse,
            delta,
            dq,
            sk_t,
            sv_t,
            T,
            WINDOW,
            KEEP,
            scale,
            DH,
            DV,
            HAS_BIAS,
            HAS_WINDOW,
            HAS_KEEP,
            PREC,
            BLOCK_N,
        )
    tl.store(
        DQ + b * sdq_b + h * sdq_h + rows[:, None] * sdq_t + d_h[None, :],
        (dq * scale).to(DQ.dtype.element_ty),
        mask=q_mask,
    )


# fp32 operands are multiplied exactly (no TF32), like the reference; fp16/bf16 operands ignore the setting.
DOT_PRECISION = "ieee"


def _lastdim_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def attention_configs(q, v, backward: bool) -> dict:
    """{op: AttentionConfig} of the forward (and both backward kernels) for q (B,T,H,dh) and v (..., dv) on their
    device; raises NoLaunchConfig, naming the shape, when one of them has no setting that fits."""
    limits = device_limits(q.device)
    ops = ("sink_forward", "sink_backward_dkdv", "sink_backward_dq") if backward else ("sink_forward",)
    configs = {}
    for op in ops:
        # the backward keeps dO in q's dtype: v's own dtype (the row masses' fp32 indicators) only enters the forward
        cfg = launch_config(
            op, q.dtype, limits, dh=q.shape[-1], dv=v.shape[-1], v_dtype=v.dtype if op == "sink_forward" else None
        )
        if cfg is None:
            raise NoLaunchConfig(
                f"no Triton launch of {op} fits {limits.name}'s {limits.shared_bytes // KB} KB of shared memory per "
                f"block for q {tuple(q.shape)} {str(q.dtype).removeprefix('torch.')}, values of width {v.shape[-1]} "
                f"{str(v.dtype).removeprefix('torch.')}"
            )
        configs[op] = cfg
    return configs


def sink_attention_forward(
    q, k, v, sink, key_bias, window, scale, out_dtype=None, softcap=None, config=None, keep=None
):
    """No autograd. q (B,T,H,dh), k (B,T,Hkv,dh), v (B,T,Hkv,dv), sink (H,) fp32 or None, key_bias (B,Hkv,T) fp32 or
    None, softcap: float or None, keep: kept first keys (with a window) or None -> out (B,T,H,dv) in out_dtype
    (default q.dtype), lse (B,H,T) fp32.
    config: the forward's AttentionConfig (default: chosen here; NoLaunchConfig when nothing fits)."""
    q, k, v = _lastdim_contiguous(q), _lastdim_contiguous(k), _lastdim_contiguous(v)
    B, T, H, dh = q.shape
    Hkv, dv = k.shape[2], v.shape[-1]
    cfg = config or attention_configs(q, v, backward=False)["sink_forward"]
    out = q.new_empty(B, T, H, dv, dtype=out_dtype or q.dtype)
    lse = q.new_empty(B, H, T, dtype=torch.float32)
    bias = key_bias if key_bias is not None else lse
    _fwd_kernel[(triton.cdiv(T, cfg.block_m), B * H)](
        q,
        k,
        v,
        sink if sink is not None else lse,
        bias,
        out,
        lse,
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k.stride(0),
        k.stride(1),
        k.stride(2),
        v.stride(0),
        v.stride(1),
        v.stride(2),
        out.stride(0),
        out.stride(1),
        out.stride(2),
        bias.stride(0),
        bias.stride(1),
        T,
        H,
        H // Hkv,
        window or 0,
        _kept(keep, window),
        scale,
        float(softcap or 0.0),
        dh,
        dv,
        HAS_SINK=sink is not None,
        HAS_BIAS=key_bias is not None,
        HAS_WINDOW=window is not None,
        HAS_KEEP=_kept(keep, window) > 0,
        HAS_CAP=softcap is not None,
        PREC=DOT_PRECISION,
        **cfg.constexprs(),
        **cfg.options(),
    )
    return out, lse


def _kept(keep, window) -> int:
    """The kept-first-keys count the kernels take: 0 (no rule) without a window, where every earlier key is seen."""
    return int(keep or 0) if window is not None else 0


class SinkAttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sink, key_bias, window, scale, configs, keep=None):
        q, k, v = _lastdim_contiguous(q), _lastdim_contiguous(k), _lastdim_contiguous(v)
        out, lse = sink_attention_forward(
            q, k, v, sink, key_bias, window, scale, config=configs["sink_forward"], keep=keep
        )
        ctx.save_for_backward(q, k, v, sink, key_bias, out, lse)
        ctx.window, ctx.scale, ctx.configs = window, scale, configs  # backward may run on another thread
        ctx.keep = _kept(keep, window)
        return out, lse

    @staticmethod
    @first_order_only
    def backward(ctx, dout, dlse):
        q, k, v, sink, key_bias, out, lse = ctx.saved_tensors
        window, scale, keep = ctx.window, ctx.scale, ctx.keep
        B, T, H, dh = q.shape
        Hkv, dv = k.shape[2], v.shape[-1]
        dout = dout.contiguous()
        delta = (dout.float() * out.float()).sum(-1).transpose(1, 2).contiguous()  # (B, H, T)  dO_i . O_i
        if dlse is not None:
            delta = delta - dlse.float()
        dq, dk, dval = (torch.empty(x.shape, device=x.device, dtype=x.dtype) for x in (q, k, v))  # contiguous
        dbias = torch.empty(B, Hkv, T, device=q.device, dtype=torch.float32) if key_bias is not None else None
        bias = key_bias if key_bias is not None else lse
        cfg_kv = ctx.configs.get("sink_backward_dkdv") or attention_configs(q, v, True)["sink_backward_dkdv"]
        cfg_q = ctx.configs.get("sink_backward_dq") or attention_configs(q, v, True)["sink_backward_dq"]
        strides = (
            q.stride(0),
            q.stride(1),
            q.stride(2),
            k.stride(0),
            k.stride(1),
            k.stride(2),
            v.stride(0),
            v.stride(1),
            v.stride(2),
            dout.stride(0),
            dout.stride(1),
            dout.stride(2),
            bias.stride(0),
            bias.stride(1),
        )
        flags = dict(
            HAS_BIAS=key_bias is not None, HAS_WINDOW=window is not None, HAS_KEEP=keep > 0, PREC=DOT_PRECISION
        )
        _bwd_dkdv_kernel[(triton.cdiv(T, cfg_kv.block_n), B * Hkv)](
            q,
            k,
            v,
            bias,
            dout,
            lse,
            delta,
            dk,
            dval,
            dbias if dbias is not None else lse,
            *strides,
            *dk.stride()[:3],
            *dval.stride()[:3],
            T,
            H,
            Hkv,
            H // Hkv,
            window or 0,
            keep,
            scale,
            dh,
            dv,
            **flags,
            **cfg_kv.constexprs(),
            **cfg_kv.options(),
        )
        _bwd_dq_kernel[(triton.cdiv(T, cfg_q.block_m), B * H)](
            q,
            k,
            v,
            bias,
            dout,
            lse,
            delta,
            dq,
            *strides,
            *dq.stride()[:3],
            T,
            H,
            H // Hkv,
            window or 0,
            keep,
            scale,
            dh,
            dv,
            **flags,
            **cfg_q.constexprs(),
            **cfg_q.options(),
        )
        dsink = None
        if sink is not None and ctx.needs_input_grad[3]:
            dsink = -(torch.exp(sink.float()[None, :, None] - lse) * delta).sum((0, 2)).to(sink.dtype)  # (H,)
        return dq, dk, dval, dsink, dbias, None, None, None, None


def sink_attention_triton(q, k, v, *, sink=None, key_bias=None, window=None, scale=None, keep=None):
    """q (B,T,H,dh), k (B,T,Hkv,dh), v (B,T,Hkv,dv) -> (out (B,T,H,dv) in q.dtype, lse (B,H,T) fp32, differentiable).
    Raises NoLaunchConfig before computing anything when the forward, or the backward a gradient would need, has no
    launch setting that fits the device."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    k, v = k.to(q.dtype), v.to(q.dtype)
    sink = None if sink is None else sink.float().contiguous()
    key_bias = None if key_bias is None else key_bias.float().contiguous()
    backward = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, sink, key_bias))
    configs = attention_configs(q, v, backward)
    return SinkAttentionFunction.apply(q, k, v, sink, key_bias, window, scale, configs, keep)
