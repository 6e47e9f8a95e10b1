"""The kept first keys of a window eviction as a second attention, merged with the window's by lse
(docs/definitions.md#window-eviction): what the kept-first-keys rule cannot say in one call.

    window part   the op under the eviction's window w: (out_w, lse_w) with the phantom, the key bias, the mask
    kept part     query t over kept keys j < keep that the window does not cover (j <= t - w), within the layer's
                  own window (``reach``: t' - j < reach, t' the query's position), scores s_tj = cap(scale q'_t . k_j)
                  + key_bias_j (+ mask_tj); positions within the cache put query t at t' = min(t, keep + w - 1)
                  (StreamingLLM: kept keys at 0 .. keep-1, the window after them), so q'_t is q_t re-rotated from
                  position t to t' by the layer's own rotary; in the text, t' = t and q'_t = q_t
    merge         lse = log(exp(lse_w) + Σ_j exp(s_tj)); out = out_w exp(lse_w - lse) + Σ_j exp(s_tj - lse) v_j

The kept part is T x keep (a few keys): memory O(T). hook_rot_q / hook_rot_k carry rotated vectors, so the
re-rotation is the rotation by angle(t') - angle(t) of the layer's (cos, sin) table (rotate-half pairs over its first
d_rot coordinates), which is exact for any table whose rows are rotations.
"""

from __future__ import annotations

import math

import torch

from probe.kernels.common import wide


def rerotate(q: torch.Tensor, rotary, frm: torch.Tensor, to: torch.Tensor) -> torch.Tensor:
    """q (B,T,H,dh) rotated at positions ``frm`` (T,) -> rotated at ``to`` (T,): rotate-half pairs over the first
    d_rot coordinates, rotary = (cos, sin) (n, d_rot/2) at positions 0 .. n-1."""
    cos, sin = (wide(t).to(q.device) for t in rotary)
    half = cos.shape[-1]
    c = cos[to] * cos[frm] + sin[to] * sin[frm]  # cos(angle(to) - angle(frm)), (T, d_rot/2)
    s = sin[to] * cos[frm] - cos[to] * sin[frm]
    x = wide(q)
    x1, x2, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
    c, s = c[None, :, None], s[None, :, None]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s, rest], -1)


def kept_scores(q, k, *, keep, window, reach, cache, rotary, key_bias, mask, scale, softcap=None) -> torch.Tensor:
    """(B,H,T,keep) logits of the kept part (-inf where a kept key is not in it); q (B,T,H,dh), k (B,T,Hkv,dh)."""
    B, T, H, dh = q.shape
    G = H // k.shape[2]
    scale = 1.0 / math.sqrt(dh) if scale is None else scale
    t = torch.arange(T, device=q.device)
    pos = t.clamp(max=keep + window - 1) if cache else t  # each query's position
    if cache:
        q = rerotate(q, rotary, t, pos)
    kk = wide(k[:, :keep]).repeat_interleave(G, 2)  # (B, keep, H, dh)
    s = scale * torch.einsum("bthd,bjhd->bhtj", wide(q), kk)
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if key_bias is not None:
        s = s + wide(key_bias[..., :keep]).repeat_interleave(G, 1)[:, :, None, :]
    if mask is not None:
        s = s + wide(mask[..., :keep])
    j = torch.arange(keep, device=q.device)[None, :]
    seen = j <= t[:, None] - window  # outside the window part
    if reach is not None:
        seen &= pos[:, None] - j < reach
    return s.masked_fill(~seen, float("-inf"))


def merge_kept(res, q, k, v, plan, *, rotary, key_bias, mask, scale, softcap=None):
    """``res`` (an AttentionOutput of the window part, with its lse over every key and the phantom) with the kept
    part merged in: out, lse, lse_real and (when ``res`` has one) the pattern and phantom."""
    s = kept_scores(
        q,
        k,
        keep=plan.keep,
        window=plan.window,
        reach=plan.reach,
        cache=plan.cache,
        rotary=rotary,
        key_bias=key_bias,
        mask=mask,
        scale=scale,
        softcap=softcap,
    )  # (B, H, T, keep)
    G = q.shape[2] // k.shape[2]
    lse_k = s.logsumexp(-1)  # (B, H, T); -inf where no kept key is in the kept part
    lse_w = wide(res.lse)
    lse = torch.logaddexp(lse_w, lse_k)
    a_w = torch.exp(lse_w - lse)  # the window part's share of each row
    p_k = torch.exp(s - lse[..., None])  # (B, H, T, keep)
    vk = wide(v[:, : plan.keep]).repeat_interleave(G, 2)  # (B, keep, H, dv)
    out = wide(res.out) * a_w.transpose(1, 2)[..., None] + torch.einsum("bhtj,bjhd->bthd", p_k, vk)
    real = None if res.lse_real is None else torch.logaddexp(wide(res.lse_real), lse_k)
    pattern, phantom = res.pattern, res.phantom
    if pattern is not None:
        pattern = pattern * a_w[..., None]
        pattern = torch.cat([pattern[..., : plan.keep] + p_k, pattern[..., plan.keep :]], -1)
        phantom = phantom * a_w
    return res._replace(out=out.to(q.dtype), lse=lse, pattern=pattern, phantom=phantom, lse_real=real)
