"""Triton kernels for attention over depth (forward + backward), reading the S sources through pointer tables.

Sources are never stacked: each call builds small int64 device tables holding, per source, the data pointer and the
(batch, time) strides of its value and of its key (last dim must be contiguous; S-LR keys `o[..., -r:]` qualify). A
kernel loads pointer i from the table, casts it to the dtype of source 0, and reads rows b*stride_b + t*stride_t.
Gradients are written into freshly allocated contiguous tensors, one per source, also through a table.

Forward: grid (row blocks of B*T, d blocks). Each program scores the S keys of its rows (r-wide, cheap enough to redo
per d block) with an online softmax and accumulates its d slice of h; the d-block-0 program writes lse.
Backward: grid (row blocks). Per row delta = dh . h, then per source i, with α_i = exp(s_i - lse):
    dvalues_i = α_i dh        dα_i = dh . v_i (looping over d blocks)       ds_i = α_i ((dα_i - delta) + dlse)
    dbias_i = Σ_rows ds_i     dquery = Σ_rows,i ds_i k̄_i      dk̄_i = ds_i query
    dk_i = rstd (dk̄_i - k̄_i mean(dk̄_i ⊙ k̄_i))   (through the gain-free RMSNorm)
delta is summed in the kernel by the same loop as dα_i, and dlse is added after the difference: with one source the
forward's h is v itself, so dα - delta is exactly 0 and, without an lse gradient, so are dquery, dkeys and dbias, as
the reference's autograd gives them (a delta summed elsewhere differs from dα by rounding, ~1e-6).
dquery and dbias are reduced per program into small (n_blocks, r) / (n_blocks, S) buffers and summed in PyTorch
(deterministic, no atomics).
Rows per program, the d slice and warps come from probe.kernels.launch.launch_config, chosen before anything runs
(``depth_configs``); NoLaunchConfig when nothing fits, and the dispatch takes the torch loop.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from probe.kernels.common import first_order_only
from probe.kernels.launch import KB, NoLaunchConfig, device_limits, launch_config


@triton.jit
def _key_scores(
    KPTR,
    KSTR,
    K0,
    i,
    q,
    boffs,
    toffs,
    rmask,
    r_off,
    r_mask,
    R,
    eps,
    BIAS,
    NORMALIZE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    """Source i's keys of these rows: (k (T_, R) fp32, rstd (T_,), score (T_,))."""
    kp = tl.load(KPTR + i).to(K0.dtype)
    k_row = boffs * tl.load(KSTR + 2 * i) + toffs * tl.load(KSTR + 2 * i + 1)  # (T_,) int64
    k = tl.load(kp + k_row[:, None] + r_off[None, :], mask=rmask[:, None] & r_mask[None, :], other=0.0).to(tl.float32)
    s = tl.sum(k * q[None, :], 1)  # (T_,)
    rstd = tl.zeros_like(s) + 1.0
    if NORMALIZE:
        rstd = tl.rsqrt(tl.sum(k * k, 1) / R + eps)
    s = s * rstd
    if HAS_BIAS:
        s += tl.load(BIAS + i).to(tl.float32)
    return k, rstd, s


@triton.jit
def _depth_fwd_kernel(
    VPTR,
    VSTR,
    V0,
    KPTR,
    KSTR,
    K0,
    QUERY,
    BIAS,
    H,
    LSE,
    S,
    N,
    T,
    D,
    R,
    eps,
    NORMALIZE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    pid_t, pid_d = tl.program_id(0), tl.program_id(1)
    rows = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    rmask = rows < N
    boffs, toffs = (rows // T).to(tl.int64), (rows % T).to(tl.int64)
    d_off = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    d_mask = d_off < D
    r_off = tl.arange(0, BLOCK_R)
    r_mask = r_off < R
    q = tl.load(QUERY + r_off, mask=r_mask, other=0.0).to(tl.float32)  # (R,)
    m = tl.full([BLOCK_T], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_T], tl.float32)
    acc = tl.zeros([BLOCK_T, BLOCK_D], tl.float32)
    for i in range(S):
        _, _, s = _key_scores(
            KPTR, KSTR, K0, i, q, boffs, toffs, rmask, r_off, r_mask, R, eps, BIAS, NORMALIZE, HAS_BIAS
        )
        m_new = tl.maximum(m, s)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha, p = tl.exp(m - m_safe), tl.exp(s - m_safe)
        vp = tl.load(VPTR + i).to(V0.dtype)
        v_row = boffs * tl.load(VSTR + 2 * i) + toffs * tl.load(VSTR + 2 * i + 1)
        v = tl.load(vp + v_row[:, None] + d_off[None, :], mask=rmask[:, None] & d_mask[None, :], other=0.0)
        acc = acc * alpha[:, None] + p[:, None] * v.to(tl.float32)
        l = l * alpha + p
        m = m_new
    tl.store(
        H + rows[:, None].to(tl.int64) * D + d_off[None, :],
        (acc / l[:, None]).to(H.dtype.element_ty),
        mask=rmask[:, None] & d_mask[None, :],
    )
    if pid_d == 0:
        tl.store(LSE + rows, m + tl.log(l), mask=rmask)


@triton.jit
def _depth_bwd_kernel(
    VPTR,
    VSTR,
    V0,
    KPTR,
    KSTR,
    K0,
    QUERY,
    BIAS,
    DH,
    H,
    LSE,
    DLSE,
    DVPTR,
    DV0,
    DKPTR,
    DK0,
    DQ_PART,
    DB_PART,
    S,
    N,
    T,
    D,
    R,
    eps,
    NORMALIZE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    rmask = rows < N
    rows64 = rows.to(tl.int64)
    boffs, toffs = rows64 // T, rows64 % T
    r_off = tl.arange(0, BLOCK_R)
    r_mask = r_off < R
    q = tl.load(QUERY + r_off, mask=r_mask, other=0.0).to(tl.float32)  # (R,)
    lse = tl.load(LSE + rows, mask=rmask, other=float("inf"))
    dlse = tl.load(DLSE + rows, mask=rmask, other=0.0)
    delta = tl.zeros([BLOCK_T], tl.float32)  # dh . h, summed as dalpha is below
    for d0 in range(0, D, BLOCK_D):
        d_off = d0 + tl.arange(0, BLOCK_D)
        msk = rmask[:, None] & (d_off < D)[None, :]
        dh = tl.load(DH + rows64[:, None] * D + d_off[None, :], mask=msk, other=0.0).to(tl.float32)
        h = tl.load(H + rows64[:, None] * D + d_off[None, :], mask=msk, other=0.0).to(tl.float32)
        delta += tl.sum(dh * h, 1)
    dq = tl.zeros([BLOCK_T, BLOCK_R], tl.float32)
    for i in range(S):
        k, rstd, s = _key_scores(
            KPTR, KSTR, K0, i, q, boffs, toffs, rmask, r_off, r_mask, R, eps, BIAS, NORMALIZE, HAS_BIAS
        )
        alpha = tl.exp(s - lse)  # (T_,), 0 on padding rows
        vp = tl.load(VPTR + i).to(V0.dtype)
        v_row = boffs * tl.load(VSTR + 2 * i) + toffs * tl.load(VSTR + 2 * i + 1)
        dvp = tl.load(DVPTR + i).to(DV0.dtype)  # contiguous (B, T, d)
        dalpha = tl.zeros([BLOCK_T], tl.float32)
        for d0 in range(0, D, BLOCK_D):
            d_off = d0 + tl.arange(0, BLOCK_D)
            msk = rmask[:, None] & (d_off < D)[None, :]
            dh = tl.load(DH + rows64[:, None] * D + d_off[None, :], mask=msk, other=0.0).to(tl.float32)
            v = tl.load(vp + v_row[:, None] + d_off[None, :], mask=msk, other=0.0).to(tl.float32)
            dalpha += tl.sum(dh * v, 1)
            tl.store(
                dvp + rows64[:, None] * D + d_off[None, :], (alpha[:, None] * dh).to(DV0.dtype.element_ty), mask=msk
            )
        ds = tl.where(rmask, alpha * ((dalpha - delta) + dlse), 0.0)  # (T_,)  d loss / d score_i
        kbar = k * rstd[:, None]  # (T_, R)
        dq += ds[:, None] * kbar
        dkbar = ds[:, None] * q[None, :]
        dk = dkbar
        if NORMALIZE:
            dk = rstd[:, None] * (dkbar - kbar * (tl.sum(dkbar * kbar, 1) / R)[:, None])
        dkp = tl.load(DKPTR + i).to(DK0.dtype)  # contiguous (B, T, r)
        tl.store(
            dkp + rows64[:, None] * R + r_off[None, :],
            dk.to(DK0.dtype.element_ty),
            mask=rmask[:, None] & r_mask[None, :],
        )
        if HAS_BIAS:
            tl.store(DB_PART + pid * S + i, tl.sum(ds, 0))
    tl.store(DQ_PART + pid * R + r_off, tl.sum(dq, 0), mask=r_mask)


def depth_configs(value: torch.Tensor, r: int, backward: bool) -> dict:
    """{op: DepthConfig} of the forward (and backward) for sources like ``value`` (B,T,d) with keys of width r;
    NoLaunchConfig, naming the shape, when one has no setting that fits the device."""
    limits = device_limits(value.device)
    configs = {}
    for op in ("depth_forward", "depth_backward") if backward else ("depth_forward",):
        cfg = launch_config(op, value.dtype, limits, d=value.shape[-1], r=r)
        if cfg is None:
            raise NoLaunchConfig(
                f"no Triton launch of {op} fits {limits.name}'s {limits.shared_bytes // KB} KB of "
                f"shared memory per block for sources {tuple(value.shape)} "
                f"{str(value.dtype).removeprefix('torch.')} with keys of width {r}"
            )
        configs[op] = cfg
    return configs


def _tables(ts):
    """(pointer table (S,), stride table (S, 2)) int64 on the tensors' device."""
    dev = ts[0].device
    ptr = torch.tensor([t.data_ptr() for t in ts], dtype=torch.int64, device=dev)
    strides = torch.tensor([[t.stride(0), t.stride(1)] for t in ts], dtype=torch.int64, device=dev)
    return ptr, strides


def _rowwise(ts):
    return [t if t.stride(-1) == 1 else t.contiguous() for t in ts]


class DepthAttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, query, bias, normalize, eps, S, configs, *sources):
        values, keys = _rowwise(sources[:S]), _rowwise(sources[S:])
        B, T, D = values[0].shape
        R, N = keys[0].shape[-1], B * T
        h = values[0].new_empty(B, T, D)
        lse = torch.empty(B, T, device=h.device, dtype=torch.float32)
        (vptr, vstr), (kptr, kstr) = _tables(values), _tables(keys)
        cfg = configs["depth_forward"]
        _depth_fwd_kernel[(triton.cdiv(N, cfg.block_t), triton.cdiv(D, cfg.block_d))](
            vptr,
            vstr,
            values[0],
            kptr,
            kstr,
            keys[0],
            query,
            bias if bias is not None else lse,
            h,
            lse,
            S,
            N,
            T,
            D,
            R,
            eps,
            NORMALIZE=normalize,
            HAS_BIAS=bias is not None,
            **cfg.constexprs(),
            **cfg.options(),
        )
        ctx.save_for_backward(query, bias, h, lse, *values, *keys)
        ctx.normalize, ctx.eps, ctx.S, ctx.configs = normalize, eps, S, configs  # backward may run on another thread
        return h, lse

    @staticmethod
    @first_order_only
    def backward(ctx, dh, dlse):
        query, bias, h, lse, *sources = ctx.saved_tensors
        S = ctx.S
        values, keys = sources[:S], sources[S:]
        B, T, D = values[0].shape
        R, N = keys[0].shape[-1], B * T
        dh = dh.contiguous()
        dlse = torch.zeros(B, T, device=h.device) if dlse is None else dlse.float().contiguous()
        dvalues = [torch.empty(B, T, D, device=h.device, dtype=v.dtype) for v in values]
        dkeys = [torch.empty(B, T, R, device=h.device, dtype=k.dtype) for k in keys]
        cfg = ctx.configs.get("depth_backward") or depth_configs(values[0], R, True)["depth_backward"]
        n_blocks = triton.cdiv(N, cfg.block_t)
        dq_part = torch.empty(n_blocks, R, device=h.device, dtype=torch.float32)
        db_part = torch.empty(n_blocks, S, device=h.device, dtype=torch.float32)
        (vptr, vstr), (kptr, kstr) = _tables(values), _tables(keys)
        dvptr, dkptr = _tables(dvalues)[0], _tables(dkeys)[0]
        _depth_bwd_kernel[(n_blocks,)](
            vptr,
            vstr,
            values[0],
            kptr,
            kstr,
            keys[0],
            query,
            bias if bias is not None else lse,
            dh,
            h,
            lse,
            dlse,
            dvptr,
            dvalues[0],
            dkptr,
            dkeys[0],
            dq_part,
            db_part,
            S,
            N,
            T,
            D,
            R,
            ctx.eps,
            NORMALIZE=ctx.normalize,
            HAS_BIAS=bias is not None,
            **cfg.constexprs(),
            **cfg.options(),
        )
        dquery = dq_part.sum(0).to(query.dtype)
        dbias = db_part.sum(0).to(bias.dtype) if bias is not None else None
        return (dquery, dbias, None, None, None, None, *dvalues, *dkeys)


def depth_attention_triton(values, keys, query, *, bias=None, normalize=True, eps=1e-6):
    """values: S x (B,T,d), keys: S x (B,T,r), query (r,) -> (h (B,T,d) in values' dtype, lse (B,T) fp32).
    Raises NoLaunchConfig before computing anything when a launch it needs does not fit the device."""
    values, keys = list(values), list(keys)
    if any(v.dtype != values[0].dtype for v in values) or any(k.dtype != keys[0].dtype for k in keys):
        raise ValueError("depth_attention (triton): all values must share one dtype, and all keys one dtype")
    bias = None if bias is None else bias.contiguous()
    backward = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (query, bias, *values, *keys))
    configs = depth_configs(values[0], keys[0].shape[-1], backward)
    return DepthAttentionFunction.apply(
        query.contiguous(), bias, bool(normalize), float(eps), len(values), configs, *values, *keys
    )
