"""Row masses read from the forward's real-key lse (``hook_lse``, docs/definitions.md#row-log-normaliser) when the
indicator columns mark few keys (key 0, a few positions) or every key: only the marked keys are scored."""

from __future__ import annotations

import torch

SPARSE_KEYS_PER_STEP = 64  # marked keys scored at once: B x H x T x 64 fp32 at most


def row_masses_sparse(q, k, indicators, lse_real, *, sink=None, key_bias=None, window=None, scale, softcap=None):
    """The masses from the forward's real-key lse when the indicator columns mark few keys: a column marking every
    key gets the real mass exp(l - L), L = logaddexp(l, sink); the other columns' marked keys J are scored alone,
    mass = Σ_{j in J} ind_j exp(s_ij - L), O(T |J| dh) instead of O(T^2 dh).
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
        if softcap is not None:  # Gemma 2: the q.k score only, before the key bias
            s = softcap * torch.tanh(s / softcap)
        if key_bias is not None:
            s = s + key_bias[:, :, None, None, J].float()
        visible = (J[None, :] <= i) if window is None else (J[None, :] <= i) & (J[None, :] > i - window)
        p = torch.exp(s.masked_fill(~visible, float("-inf")).flatten(1, 2) - lse_safe[..., None])  # (B, H, T, nJ)
        marks = ind[:, J][..., sparse].permute(0, 2, 1, 3)[:, :, None]  # (B, Hkv, 1, nJ, m_sparse)
        masses[..., sparse] += (p.unflatten(1, (Hkv, G)) @ marks).flatten(1, 2)
    return lse, masses
