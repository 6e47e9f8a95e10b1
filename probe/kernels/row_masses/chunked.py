"""Row masses from explicit scores over blocks of ``chunk`` queries and only the keys they can see: bounded by
chunk x (chunk + window) scores; windows, Gemma 2's soft-cap and any device."""

from __future__ import annotations

import torch

from probe.kernels.row_masses.flash import fold_sink


def row_masses_chunked(q, k, indicators, *, sink=None, key_bias=None, window=None, scale, softcap=None, chunk=256):
    """q (B,T,H,dh), k (B,T,Hkv,dh), indicators (B,T,Hkv,m) -> (lse (B,H,T), masses (B,H,T,m)) fp32."""
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
        if softcap is not None:  # Gemma 2: the q.k score only, before the key bias
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
    return fold_sink(lse_all, masses_all, sink)
