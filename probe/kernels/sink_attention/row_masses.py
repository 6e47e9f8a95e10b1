"""Per-row attention masses on chosen key sets, without T x T memory (sink statistics, quiet mass, exposure).

    masses[b,h,i,c] = Σ_j a_ij indicators[b,j,h//G,c]      a includes the phantom in its normaliser
    lse[b,h,i]      = log(exp(sink_h) + Σ_j exp(s_ij))      so phantom_i = exp(sink_h - lse_i)

With the forward's real-key lse (``hook_lse``) and columns that mark few keys (key 0, a few positions) or every
key, ``row_masses_sparse`` scores only the marked keys. Otherwise three torch paths: the fused CPU flash kernel
(`_scaled_dot_product_flash_attention_for_cpu` takes (B,H,T,D) q/k/v with one shared head size and returns (out,
lse (B,H,T)); the indicators ride as the values, key_bias as one extra q/k coordinate, and the sink is folded in
afterwards: lse' = logaddexp(lse, sink), out' = out exp(lse - lse')); an explicit chunked path (windows, Gemma 2's
soft-cap, non-CPU devices) bounded by chunk x (chunk + window) scores; and the T x T reference. The fused flash op
computes the scores itself, so it cannot apply a soft-cap (s -> softcap * tanh(s / softcap), on scale * q.k only,
before key_bias and the sink, as in reference.py): a soft-capped call goes to the chunked path or the Triton kernel
(probe.kernels.dispatch).
"""

from __future__ import annotations

import torch

from probe.kernels.sink_attention.reference import sink_attention_reference
from probe.kernels.sink_attention.sdpa import _cpu_flash, _pad_last


def _fold_sink(lse, masses, sink):
    if sink is None:
        return lse, masses
    lse_s = torch.logaddexp(lse, sink.float()[None, :, None])  # (B, H, T)
    return lse_s, masses * torch.exp(lse - lse_s)[..., None]


def row_masses_reference(q, k, indicators, *, sink=None, key_bias=None, window=None, scale=None, softcap=None):
    out, lse, _, _ = sink_attention_reference(
        q.float(),
        k.float(),
        indicators.float(),
        sink=None if sink is None else sink.float(),  # fp32 throughout, whatever the inputs' dtype
        key_bias=None if key_bias is None else key_bias.float(),
        window=window,
        scale=scale,
        softcap=softcap,
    )
    return lse, out.transpose(1, 2)  # (B, H, T), (B, H, T, m)


def row_masses_flash_cpu(q, k, indicators, *, sink=None, key_bias=None, scale):
    """Causal, no window, no soft-cap, CPU tensors."""
    B, T, H, dh = q.shape
    m = indicators.shape[-1]
    qt, kt, vt = q.float().transpose(1, 2), k.float().transpose(1, 2), indicators.float().transpose(1, 2)
    if key_bias is not None:  # q gets 1/scale, k gets key_bias: the logit gains key_bias exactly
        qt = torch.cat([qt, qt.new_full((B, H, T, 1), 1.0 / scale)], -1)
        kt = torch.cat([kt, key_bias.float()[..., None]], -1)
    D = -(-max(qt.shape[-1], m) // 8) * 8
    out, lse = _cpu_flash(_pad_last(qt, D), _pad_last(kt, D), _pad_last(vt, D), 0.0, True, scale=scale)
    return _fold_sink(lse.float(), out[..., :m], sink)


def row_masses_chunked(q, k, indicators, *, sink=None, key_bias=None, window=None, scale, softcap=None, chunk=256):
    """Explicit scores over blocks of `chunk` queries and only the keys they can see; any device."""
    B, T, H, dh = q.shape
    Hkv, m = k.shape[2], indicators.shape[-1]
    G = H // Hkv
    lse_all = q.new_empty(B, H, T, dtype=torch.float32)
    masses_all = q.new_empty(B, H, T, m, dtype=torch.float32)
    for i0 in range(0, T, chunk):
        i1 = min(T, i0 + chunk)
        j0 = 0 if window is None else max(0, i0 - window + 1)
        qc = q[:, i0:i1].float().unflatten(2, (Hkv, G)).permute(0, 2, 3, 1, 4)  # (B, Hkv, G, c, dh)
        kc = k[:, j0:i1].float().permute(0, 2, 1, 3)[:, :, None]  # (B, Hkv, 1, n, dh)
        s = scale * (qc @ kc.transpose(-1, -2))  # (B, Hkv, G, c, n)
        if softcap is not None:  # Gemma 2: the q.k score only, before the key bias (reference.py)
            s = softcap * torch.tanh(s / softcap)
        if key_bias is not None:
            s = s + key_bias[:, :, None, None, j0:i1].float()
        i = torch.arange(i0, i1, device=q.device)[:, None]
        j = torch.arange(j0, i1, device=q.device)[None, :]
        visible = (j <= i) if window is None else (j <= i) & (j > i - window)
        s = s.masked_fill(~visible, float("-inf")).flatten(1, 2)  # (B, H, c, n)
        lse = s.logsumexp(-1)  # (B, H, c)
        a = torch.exp(s - lse[..., None]).unflatten(1, (Hkv, G))  # (B, Hkv, G, c, n)
        ind = indicators[:, j0:i1].float().permute(0, 2, 1, 3)[:, :, None]  # (B, Hkv, 1, n, m)
        lse_all[:, :, i0:i1] = lse
        masses_all[:, :, i0:i1] = (a @ ind).flatten(1, 2)
    return _fold_sink(lse_all, masses_all, sink)


SPARSE_KEYS_PER_STEP = 64  # marked keys scored at once: B x H x T x 64 fp32 at most


def row_masses_sparse(q, k, indicators, lse_real, *, sink=None, key_bias=None, window=None, scale, softcap=None):
    """The masses from the forward's real-key lse (docs/definitions.md#row-log-normaliser) when the indicator
    columns mark few keys: a column marking every key gets the real mass exp(l - L), L = logaddexp(l, sink); the other
    columns' marked keys J are scored alone, mass = Σ_{j in J} ind_j exp(s_ij - L), O(T |J| dh) instead of O(T^2 dh).
    Returns None when the sparse columns mark more than T / 8 keys (recomputing every score is then no dearer)."""
    B, T, H, dh = q.shape
    Hkv, m = k.shape[2], indicators.shape[-1]
    G = H // Hkv
    ind = indicators.float()  # (B, T, Hkv, m)
    every = (ind == 1).flatten(0, 2).all(0)  # (m,) columns that mark every key
    sparse = (~every).nonzero().squeeze(1)
    keys = ind[..., sparse].ne(0).any(-1).any(-1).any(0).nonzero().squeeze(1)  # (nJ,) keys any sparse column marks
    if len(keys) > max(SPARSE_KEYS_PER_STEP, T // 8):
        return None
    real = lse_real.float()  # (B, H, T)
    lse = real if sink is None else torch.logaddexp(real, sink.float()[None, :, None])
    lse_safe = lse.masked_fill(lse == float("-inf"), 0.0)  # a row that sees nothing: zero mass, not NaN
    masses = q.new_zeros(B, H, T, m, dtype=torch.float32)
    masses[..., every] = torch.exp(real - lse_safe).masked_fill(lse == float("-inf"), 0.0)[..., None]
    qh = q.float().unflatten(2, (Hkv, G)).permute(0, 2, 3, 1, 4)  # (B, Hkv, G, T, dh)
    i = torch.arange(T, device=q.device)[:, None]
    for a in range(0, len(keys), SPARSE_KEYS_PER_STEP):
        J = keys[a : a + SPARSE_KEYS_PER_STEP]
        s = scale * (qh @ k[:, J].float().permute(0, 2, 3, 1)[:, :, None])  # (B, Hkv, G, T, nJ)
        if softcap is not None:  # Gemma 2: the q.k score only, before the key bias (reference.py)
            s = softcap * torch.tanh(s / softcap)
        if key_bias is not None:
            s = s + key_bias[:, :, None, None, J].float()
        visible = (J[None, :] <= i) if window is None else (J[None, :] <= i) & (J[None, :] > i - window)
        p = torch.exp(s.masked_fill(~visible, float("-inf")).flatten(1, 2) - lse_safe[..., None])  # (B, H, T, nJ)
        marks = ind[:, J][..., sparse].permute(0, 2, 1, 3)[:, :, None]  # (B, Hkv, 1, nJ, m_sparse)
        masses[..., sparse] += (p.unflatten(1, (Hkv, G)) @ marks).flatten(1, 2)
    return lse, masses


def row_masses_triton(q, k, indicators, *, sink=None, key_bias=None, window=None, scale, softcap=None):
    """The sink-attention forward with the indicators as fp32 values; NoLaunchConfig when it does not fit the
    device (probe.kernels.launch)."""
    from probe.kernels.sink_attention.triton import attention_configs, sink_attention_forward

    ind = indicators.float()  # p @ indicators in fp32 (exact dot), whatever q's dtype
    config = attention_configs(q, ind, backward=False)["sink_forward"]
    sink = None if sink is None else sink.float().contiguous()
    key_bias = None if key_bias is None else key_bias.float().contiguous()
    out, lse = sink_attention_forward(
        q, k.to(q.dtype), ind, sink, key_bias, window, scale, out_dtype=torch.float32, softcap=softcap, config=config
    )
    return lse, out.transpose(1, 2)
