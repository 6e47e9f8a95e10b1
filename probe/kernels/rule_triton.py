"""Triton flash-style attention under the row rules that extend sink attention's tiles with a per-row rule (fwd +
bwd): the pointwise rules (sigmoid with its logit bias, elu + 1, normalised or not) and softpick
(docs/definitions.md#rules-on-triton). Stick-breaking is not here: its weight of key j needs the sum over every later
key of the row, a reversed scan across tiles, which this loop over key tiles does not carry.

Layout, GQA, the causal / sliding-window rule, the key bias and the scale are sink attention's
(probe.kernels.sink_attention.triton: its _scores, _tile, _query_block, _key_range); there is no phantom key, soft-cap
or kept-first-keys rule. Each row keeps L, the log of the weights' common denominator, so that a_ij is a function of
s_ij and L_i alone, as softmax's p_ij is of its lse:

    pointwise    not normalised: a = f(s + b), L = 0;  normalised: a = f(s + b) / D, L = log D, D = sum_j w_j + eps
                 ds = (dp - c) f' e^-L  (c = dO . O where normalised, else 0)           (pointwise/triton.py)
    softpick     a = relu(exp(s - L) - exp(-L)), L = m + log D; ds as softpick/triton.py, with its shift's key

Backward (FA2 style, no atomics, as sink attention's): c_i = dO_i . O_i;  dv_j = sum_i a_ij dO_i;
dk_j = scale sum_i ds_ij q_i;  dbias_j = sum_i ds_ij  (one program per key block, looping over the G query heads of its
kv head);  dq_i = scale sum_j ds_ij k_j  (one program per query block). Tiles, warps and stages from
probe.kernels.launch.launch_config (ops rule_forward, rule_backward_dkdv, rule_backward_dq); NoLaunchConfig when
nothing fits, and the dispatch runs the torch path.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from probe.kernels.common import first_order_only
from probe.kernels.launch import KB, NoLaunchConfig, device_limits, launch_config
from probe.kernels.pointwise.triton import pointwise_slope, pointwise_weights
from probe.kernels.sink_attention.triton import (
    DOT_PRECISION,
    _key_range,
    _lastdim_contiguous,
    _query_block,
    _scores,
    _tile,
)
from probe.kernels.softpick.triton import softpick_grads, softpick_step

RULE_IDS = {"sigmoid": 0, "elu1": 1, "softpick": 2}  # the RULE constexpr: pointwise kernels 0 and 1, softpick 2
SOFTPICK = 2


@triton.jit
def _rule_grads(s, dp, lse, delta, pick, arg, cols, b, RULE: tl.constexpr):
    """(a, ds): the weights (M, N) of a tile of scores s and dL/ds, dp = dO . v_j, for one rule."""
    if RULE == 2:
        a, ds = softpick_grads(s, dp, lse, delta, pick, arg, cols)
    else:
        x = s + b
        w = pointwise_weights(x, RULE)
        inv = tl.exp(-lse)[:, None]  # 1 / D (1 without normalisation)
        a = w * inv
        ds = (dp - delta[:, None]) * pointwise_slope(x, w, RULE) * inv
    return a, ds


@triton.jit
def _rule_fwd_kernel(
    Q,
    K,
    V,
    BIAS,
    O,
    LSE,
    PICK,
    ARG,
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
    scale,
    b,
    eps,
    DH,
    DV,
    RULE: tl.constexpr,
    NORMALISE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    PREC: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_DH: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    pid_m, pid_bh = tl.program_id(0), tl.program_id(1)
    bi, h, hk, rows, d_h, d_v = _query_block(pid_m, pid_bh, H, G, BLOCK_M, BLOCK_DH, BLOCK_DV)
    q = _tile(Q + bi * sq_b + h * sq_h, rows, d_h, sq_t, T, DH)  # (M, DH)
    m_i = tl.zeros([BLOCK_M], tl.float32)  # softpick's shift, max(0, max_j s_j) so far
    arg = tl.full([BLOCK_M], -1, tl.int32)  # the key that set it (-1: none above 0)
    l_i = tl.zeros([BLOCK_M], tl.float32)  # sum_j |e_j| (softpick) or sum_j w_j (pointwise)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    lo, hi = _key_range(pid_m, T, WINDOW, HAS_WINDOW, BLOCK_M, BLOCK_N)
    Kb, Vb, Bb = K + bi * sk_b + hk * sk_h, V + bi * sv_b + hk * sv_h, BIAS + bi * sb_b + hk * sb_h
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        k = _tile(Kb, cols, d_h, sk_t, T, DH)  # (N, DH)
        v = _tile(Vb, cols, d_v, sv_t, T, DV)  # (N, DV)
        s = _scores(q, k, Bb, rows, cols, T, WINDOW, 0, scale, 0.0, HAS_BIAS, HAS_WINDOW, False, False, PREC)
        if RULE == 2:
            e, m_i, arg, alpha = softpick_step(s, m_i, arg, start_n)
            l_i = l_i * alpha + tl.sum(tl.abs(e), 1)
            w = tl.maximum(e, 0.0)
            acc = acc * alpha[:, None] + tl.dot(w.to(v.dtype), v, input_precision=PREC)
        else:
            w = pointwise_weights(s + b, RULE)
            l_i += tl.sum(w, 1)
            acc += tl.dot(w.to(v.dtype), v, input_precision=PREC)
    lse = tl.zeros([BLOCK_M], tl.float32)
    if RULE == 2 or NORMALISE:
        den = l_i + eps
        acc = acc / den[:, None]
        lse = m_i + tl.log(den)
        if RULE == 2:
            tl.store(PICK + pid_bh * T + rows, tl.where(arg >= 0, eps / den, 0.0), mask=rows < T)
            tl.store(ARG + pid_bh * T + rows, arg, mask=rows < T)
    tl.store(
        O + bi * so_b + h * so_h + rows[:, None] * so_t + d_v[None, :],
        acc.to(O.dtype.element_ty),
        mask=(rows[:, None] < T) & (d_v[None, :] < DV),
    )
    tl.store(LSE + pid_bh * T + rows, lse, mask=rows < T)


@triton.jit
def _rule_bwd_dkdv_kernel(
    Q,
    K,
    V,
    BIAS,
    DO,
    LSE,
    DELTA,
    PICK,
    ARG,
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
    scale,
    b,
    DH,
    DV,
    RULE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    PREC: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_DH: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    pid_n, pid_bk = tl.program_id(0), tl.program_id(1)
    bi, hk = pid_bk // HKV, pid_bk % HKV
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    d_h, d_v = tl.arange(0, BLOCK_DH), tl.arange(0, BLOCK_DV)
    k = _tile(K + bi * sk_b + hk * sk_h, cols, d_h, sk_t, T, DH)  # (N, DH)
    v = _tile(V + bi * sv_b + hk * sv_h, cols, d_v, sv_t, T, DV)  # (N, DV)
    dk = tl.zeros([BLOCK_N, BLOCK_DH], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], tl.float32)
    db = tl.zeros([BLOCK_N], tl.float32)
    lo = pid_n * BLOCK_N // BLOCK_M * BLOCK_M  # first query that can see this key block (causal)
    hi = T
    if HAS_WINDOW:  # last query that sees key j is j + window - 1
        hi = tl.minimum((pid_n + 1) * BLOCK_N - 1 + WINDOW, T)
    for g in range(G):
        h = hk * G + g
        row0 = (bi * H + h) * T
        for start_m in range(lo, hi, BLOCK_M):
            rows = start_m + tl.arange(0, BLOCK_M)
            q = _tile(Q + bi * sq_b + h * sq_h, rows, d_h, sq_t, T, DH)  # (M, DH)
            do = _tile(DO + bi * sd_b + h * sd_h, rows, d_v, sd_t, T, DV)  # (M, DV)
            lse = tl.load(LSE + row0 + rows, mask=rows < T, other=0.0)
            delta = tl.load(DELTA + row0 + rows, mask=rows < T, other=0.0)
            pick = tl.zeros([BLOCK_M], tl.float32)
            arg = tl.full([BLOCK_M], -1, tl.int32)
            if RULE == 2:
                pick = tl.load(PICK + row0 + rows, mask=rows < T, other=0.0)
                arg = tl.load(ARG + row0 + rows, mask=rows < T, other=-1)
            s = _scores(
                q,
                k,
                BIAS + bi * sb_b + hk * sb_h,
                rows,
                cols,
                T,
                WINDOW,
                0,
                scale,
                0.0,
                HAS_BIAS,
                HAS_WINDOW,
                False,
                False,
                PREC,
            )
            dp = tl.dot(do, tl.trans(v), input_precision=PREC)
            a, ds = _rule_grads(s, dp, lse, delta, pick, arg, cols, b, RULE)
            dv += tl.dot(tl.trans(a).to(do.dtype), do, input_precision=PREC)
            dk += tl.dot(tl.trans(ds).to(q.dtype), q, input_precision=PREC)
            db += tl.sum(ds, 0)
    k_mask = (cols[:, None] < T) & (d_h[None, :] < DH)
    v_mask = (cols[:, None] < T) & (d_v[None, :] < DV)
    dk_at = DK + bi * sdk_b + hk * sdk_h + cols[:, None] * sdk_t + d_h[None, :]
    tl.store(dk_at, (dk * scale).to(DK.dtype.element_ty), mask=k_mask)
    dv_at = DVAL + bi * sdv_b + hk * sdv_h + cols[:, None] * sdv_t + d_v[None, :]
    tl.store(dv_at, dv.to(DVAL.dtype.element_ty), mask=v_mask)
    if HAS_BIAS:
        tl.store(DBIAS + pid_bk * T + cols, db, mask=cols < T)


@triton.jit
def _rule_bwd_dq_kernel(
    Q,
    K,
    V,
    BIAS,
    DO,
    LSE,
    DELTA,
    PICK,
    ARG,
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
    scale,
    b,
    DH,
    DV,
    RULE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    PREC: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_DH: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    pid_m, pid_bh = tl.program_id(0), tl.program_id(1)
    bi, h, hk, rows, d_h, d_v = _query_block(pid_m, pid_bh, H, G, BLOCK_M, BLOCK_DH, BLOCK_DV)
    q = _tile(Q + bi * sq_b + h * sq_h, rows, d_h, sq_t, T, DH)  # (M, DH)
    do = _tile(DO + bi * sd_b + h * sd_h, rows, d_v, sd_t, T, DV)  # (M, DV)
    lse = tl.load(LSE + pid_bh * T + rows, mask=rows < T, other=0.0)
    delta = tl.load(DELTA + pid_bh * T + rows, mask=rows < T, other=0.0)
    pick = tl.zeros([BLOCK_M], tl.float32)
    arg = tl.full([BLOCK_M], -1, tl.int32)
    if RULE == 2:
        pick = tl.load(PICK + pid_bh * T + rows, mask=rows < T, other=0.0)
        arg = tl.load(ARG + pid_bh * T + rows, mask=rows < T, other=-1)
    dq = tl.zeros([BLOCK_M, BLOCK_DH], tl.float32)
    lo, hi = _key_range(pid_m, T, WINDOW, HAS_WINDOW, BLOCK_M, BLOCK_N)
    Kb, Vb, Bb = K + bi * sk_b + hk * sk_h, V + bi * sv_b + hk * sv_h, BIAS + bi * sb_b + hk * sb_h
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        k = _tile(Kb, cols, d_h, sk_t, T, DH)
        v = _tile(Vb, cols, d_v, sv_t, T, DV)
        s = _scores(q, k, Bb, rows, cols, T, WINDOW, 0, scale, 0.0, HAS_BIAS, HAS_WINDOW, False, False, PREC)
        dp = tl.dot(do, tl.trans(v), input_precision=PREC)
        _, ds = _rule_grads(s, dp, lse, delta, pick, arg, cols, b, RULE)
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PREC)
    tl.store(
        DQ + bi * sdq_b + h * sdq_h + rows[:, None] * sdq_t + d_h[None, :],
        (dq * scale).to(DQ.dtype.element_ty),
        mask=(rows[:, None] < T) & (d_h[None, :] < DH),
    )


def rule_configs(q, v, backward: bool) -> dict:
    """{op: AttentionConfig} of the forward (and both backward kernels) for q (B,T,H,dh) and v (..., dv) on their
    device; raises NoLaunchConfig, naming the shape, when one of them has no setting that fits."""
    limits = device_limits(q.device)
    ops = ("rule_forward", "rule_backward_dkdv", "rule_backward_dq") if backward else ("rule_forward",)
    configs = {}
    for op in ops:
        cfg = launch_config(op, q.dtype, limits, dh=q.shape[-1], dv=v.shape[-1])
        if cfg is None:
            raise NoLaunchConfig(
                f"no Triton launch of {op} fits {limits.name}'s {(limits.shared_bytes or 0) // KB} KB of shared memory "
                f"per block for q {tuple(q.shape)} {str(q.dtype).removeprefix('torch.')}, values of width {v.shape[-1]}"
            )
        configs[op] = cfg
    return configs


def _strides(*tensors) -> list[int]:
    """The (batch, time, head) strides of each (B, T, heads, d) tensor, in order."""
    return [s for t in tensors for s in t.stride()[:3]]


class RuleAttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, key_bias, rule: str, normalise: bool, bias: float, eps: float, window, scale, configs):
        B, T, H, dh = q.shape
        Hkv, dv = k.shape[2], v.shape[-1]
        cfg = configs["rule_forward"]
        out = q.new_empty(B, T, H, dv)
        lse = q.new_empty(B, H, T, dtype=torch.float32)  # L: log of the row's denominator (0 where none)
        pick = q.new_zeros(B, H, T, dtype=torch.float32)  # softpick: eps / D where a key set the shift m > 0
        arg = q.new_full((B, H, T), -1, dtype=torch.int32)  # softpick: that key
        kb = key_bias if key_bias is not None else lse
        _rule_fwd_kernel[(triton.cdiv(T, cfg.block_m), B * H)](
            q, k, v, kb, out, lse, pick, arg,
            *_strides(q, k, v, out), kb.stride(0), kb.stride(1),
            T, H, H // Hkv, window or 0, scale, bias, eps, dh, dv,
            RULE=RULE_IDS[rule], NORMALISE=normalise, HAS_BIAS=key_bias is not None, HAS_WINDOW=window is not None,
            PREC=DOT_PRECISION, **cfg.constexprs(), **cfg.options(),
        )  # fmt: skip
        ctx.save_for_backward(q, k, v, key_bias, out, lse, pick, arg)
        ctx.rule, ctx.normalise, ctx.bias, ctx.window, ctx.scale, ctx.configs = (
            rule, normalise, bias, window, scale, configs
        )  # fmt: skip
        return out

    @staticmethod
    @first_order_only
    def backward(ctx, dout):
        q, k, v, key_bias, out, lse, pick, arg = ctx.saved_tensors
        B, T, H, dh = q.shape
        Hkv, dv = k.shape[2], v.shape[-1]
        dout = dout.contiguous()
        if ctx.rule == "softpick" or ctx.normalise:  # c_i = dO_i . O_i, the row's sum_j dp_ij a_ij
            delta = (dout.float() * out.float()).sum(-1).transpose(1, 2).contiguous()  # (B, H, T)
        else:
            delta = torch.zeros_like(lse)
        dq, dk, dval = (torch.empty(x.shape, device=x.device, dtype=x.dtype) for x in (q, k, v))  # contiguous
        dbias = torch.empty(B, Hkv, T, device=q.device, dtype=torch.float32) if key_bias is not None else None
        kb = key_bias if key_bias is not None else lse
        common = (*_strides(q, k, v, dout), kb.stride(0), kb.stride(1))
        flags = dict(
            RULE=RULE_IDS[ctx.rule], HAS_BIAS=key_bias is not None, HAS_WINDOW=ctx.window is not None,
            PREC=DOT_PRECISION,
        )  # fmt: skip
        cfg = ctx.configs.get("rule_backward_dkdv") or rule_configs(q, v, True)["rule_backward_dkdv"]
        _rule_bwd_dkdv_kernel[(triton.cdiv(T, cfg.block_n), B * Hkv)](
            q, k, v, kb, dout, lse, delta, pick, arg, dk, dval, dbias if dbias is not None else lse,
            *common, *_strides(dk, dval),
            T, H, Hkv, H // Hkv, ctx.window or 0, ctx.scale, ctx.bias, dh, dv,
            **flags, **cfg.constexprs(), **cfg.options(),
        )  # fmt: skip
        cfg = ctx.configs.get("rule_backward_dq") or rule_configs(q, v, True)["rule_backward_dq"]
        _rule_bwd_dq_kernel[(triton.cdiv(T, cfg.block_m), B * H)](
            q, k, v, kb, dout, lse, delta, pick, arg, dq,
            *common, *_strides(dq),
            T, H, H // Hkv, ctx.window or 0, ctx.scale, ctx.bias, dh, dv,
            **flags, **cfg.constexprs(), **cfg.options(),
        )  # fmt: skip
        return dq, dk, dval, dbias, None, None, None, None, None, None, None


def rule_attention_triton(
    q, k, v, *, rule: str, normalise: bool, bias: float = 0.0, eps: float = 0.0, key_bias=None, window=None, scale=None
) -> torch.Tensor:
    """q (B,T,H,dh), k (B,T,Hkv,dh), v (B,T,Hkv,dv) -> out (B,T,H,dv) in q.dtype, differentiable. ``rule`` one of
    RULE_IDS (softpick always normalises); ``bias`` the pointwise rules' constant logit bias, ``eps`` the
    denominator's. Raises NoLaunchConfig before computing anything when the forward, or the backward a gradient would
    need, has no launch setting that fits the device."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    q, k, v = (_lastdim_contiguous(x.to(q.dtype)) for x in (q, k, v))
    key_bias = None if key_bias is None else key_bias.float().contiguous()
    backward = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, key_bias))
    configs = rule_configs(q, v, backward)
    window = None if window is None else int(window)
    normalise = normalise or rule == "softpick"
    return RuleAttentionFunction.apply(
        q, k, v, key_bias, rule, normalise, float(bias), float(eps), window, scale, configs
    )
