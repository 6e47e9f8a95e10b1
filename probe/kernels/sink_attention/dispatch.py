"""``sink_attention``: picks the reference, the fused torch path (SDPA / CPU flash) or the Triton kernel.

    backend    path
    auto       pattern -> reference; CUDA + triton, no mask, Tq == Tk -> triton; else sdpa
    torch      pattern -> reference; else sdpa
    compiled   as torch (the runtime choice that compiles the row rules: probe.kernels.compiled)
    reference  reference.py: T x T, fp32
    sdpa       sdpa.py: fused SDPA with the phantom folded in (no pattern)
    triton     triton.py: CUDA tensors, or CPU tensors under TRITON_INTERPRET=1 (set before importing triton)

The op takes the kept-first-keys rule natively (``keep`` with a ``window``) on every path, and carries out the
attention edit passed to it (``edit``, edits.py: key-0 knockout, window eviction) through its own per-key bias and
that rule.
``backend=None`` (the default) is the runtime choice (probe.kernels.backend). When no launch setting of the Triton
kernel fits the device's shared memory (probe.kernels.launch), the call runs on sdpa instead, with one warning per
shape: never an OutOfResources.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from probe.kernels.backend import TRITON_DTYPES, check_triton, resolve_backend, triton_available
from probe.kernels.common import check_attention_args
from probe.kernels.launch import NoLaunchConfig, warn_fallback
from probe.kernels.row_masses.dispatch import attention_row_masses
from probe.kernels.sink_attention import edits, kept
from probe.kernels.sink_attention.reference import real_lse_blocked, sink_attention_reference, visible_mask
from probe.kernels.sink_attention.sdpa import sink_attention_sdpa


class AttentionOutput(NamedTuple):
    out: torch.Tensor  # (B, Tq, H, dv) in q.dtype
    lse: torch.Tensor | None  # (B, H, Tq) fp32, log(exp(sink) + Σ_visible exp(score)); None on sdpa under autograd
    pattern: torch.Tensor | None  # (B, H, Tq, Tk) fp32 over real keys, rows sum to 1 - phantom (return_pattern)
    phantom: torch.Tensor | None  # (B, H, Tq) fp32 mass on the phantom key (return_pattern)
    lse_real: torch.Tensor | None = None  # (B, H, Tq) fp32 log Σ_visible exp(score), phantom excluded (return_lse)


def auto_sink_attention(q, k, v, *, mask=None, return_pattern=False) -> str:
    """The path backend="auto" takes for these tensors: "reference" (a pattern is asked for), "triton" or "sdpa"."""
    if return_pattern:
        return "reference"
    if (
        q.device.type == "cuda"
        and triton_available()
        and q.dtype in TRITON_DTYPES
        and mask is None
        and q.shape[1] == k.shape[1]
        and max(q.shape[-1], v.shape[-1]) <= 256
    ):
        return "triton"
    return "sdpa"


def sink_attention(
    q,
    k,
    v,
    *,
    sink=None,
    key_bias=None,
    mask=None,
    window=None,
    scale=None,
    keep=None,
    return_pattern=False,
    return_lse=False,
    backend=None,
    edit: edits.AttentionEdit | None = None,
) -> AttentionOutput:
    """Causal (optionally sliding-window) GQA attention with an optional phantom sink key and per-key logit bias.

    q (B,Tq,H,dh), k (B,Tk,Hkv,dh), v (B,Tk,Hkv,dv) with Tq <= Tk (queries are the last Tq positions); query head h
    reads kv head h // (H // Hkv); key j is visible to query i iff i - window < j <= i. sink (H,): phantom logit per
    query head, value 0 (None = no phantom = -inf). key_bias (B,Hkv,Tk): extra additive logit per key (the routing
    slot's log g_j). mask: additive logits broadcastable to (B,H,Tq,Tk) that replace the causal/window rule (HF
    padding masks; not on Triton). scale defaults to 1/sqrt(dh). Value gates are the caller's: v is aggregated as given.
    keep: with a window, keys j < keep stay visible to every later query (the kept-first-keys rule).
    return_lse: also give ``lse_real``, each row's lse over the real keys (docs/definitions.md#row-log-normaliser):
    the fused kernel's own where it has one, else computed in query blocks.
    edit: a key-0 knockout or window eviction (probe.kernels.sink_attention.edits.AttentionEdit) carried out here.
    """
    if edit is not None:
        return _edited_attention(
            edit,
            q,
            k,
            v,
            sink=sink,
            key_bias=key_bias,
            mask=mask,
            window=window,
            scale=scale,
            keep=keep,
            return_pattern=return_pattern,
            return_lse=return_lse,
            backend=backend,
        )
    res = _sink_attention(q, k, v, sink, key_bias, mask, window, scale, keep, return_pattern, backend)
    if not return_lse or res.lse_real is not None:
        return res
    if sink is None and res.lse is not None:  # without a phantom the kernel's lse is over the real keys
        return res._replace(lse_real=res.lse)
    return res._replace(lse_real=real_lse(q, k, sink, key_bias, mask, window, scale, keep, backend))


def real_lse(q, k, sink, key_bias, mask, window, scale, keep, backend) -> torch.Tensor:
    """lse over the real keys where the attention's path did not give it: log of the real mass the row-mass op sums
    (well conditioned however much the phantom takes; fp32), or with a mask, a cache, kept first keys or fp64 inputs,
    query blocks."""
    if mask is not None or keep is not None or q.shape[1] != k.shape[1] or q.dtype == torch.float64:
        real = real_lse_blocked(q, k, key_bias=key_bias, mask=mask, window=window, scale=scale, keep=keep)
        return real if q.dtype == torch.float64 else real.float()  # fp64 inputs keep fp64, as the reference does
    every = q.new_ones(*k.shape[:3], 1, dtype=torch.float32)  # (B, T, Hkv, 1)
    with torch.no_grad():
        lse, mass = attention_row_masses(
            q, k, every, sink=sink, key_bias=key_bias, window=window, scale=scale, backend=backend
        )
    return lse.float() + torch.log(mass[..., 0].float())


def _sink_attention(q, k, v, sink, key_bias, mask, window, scale, keep, return_pattern, backend) -> AttentionOutput:
    backend = resolve_backend(backend)
    check_attention_args(q, k, v, sink, key_bias, window, mask, keep)
    window = None if window is None else int(window)
    keep = None if keep is None or window is None else int(keep)
    kw = dict(sink=sink, key_bias=key_bias, window=window, scale=scale, keep=keep)
    if backend in ("sdpa", "triton") and return_pattern:
        raise ValueError(f"backend={backend!r} cannot return the pattern; use 'reference', 'torch' or 'auto'")
    if backend == "auto":
        backend = auto_sink_attention(q, k, v, mask=mask, return_pattern=return_pattern)
    elif backend in ("torch", "compiled"):  # compiled: the row rules' choice; sink attention's torch path is fused
        backend = "reference" if return_pattern else "sdpa"

    if backend == "reference":
        out, lse, pattern, phantom = sink_attention_reference(q, k, v, mask=mask, return_pattern=return_pattern, **kw)
        return AttentionOutput(out, lse, pattern, phantom)
    if backend == "sdpa":
        out, lse, real = sink_attention_sdpa(q, k, v, mask=mask, **kw)
        return AttentionOutput(out, lse, None, None, real)
    if mask is not None or q.shape[1] != k.shape[1]:
        raise ValueError("backend='triton' runs causal/window attention over one sequence: no mask, Tq == Tk")
    check_triton(q.device)
    from probe.kernels.sink_attention.triton import sink_attention_triton

    try:
        out, lse = sink_attention_triton(q, k, v, **kw)
        return AttentionOutput(out, lse, None, None)
    except NoLaunchConfig as e:
        warn_fallback(e, "sdpa")
        out, lse, real = sink_attention_sdpa(q, k, v, mask=None, **kw)
        return AttentionOutput(out, lse, None, None, real)


def _edited_attention(edit, q, k, v, *, sink, key_bias, mask, window, scale, keep, return_pattern, return_lse, backend):
    """sink_attention with ``edit`` carried out by the op itself (edits.py), over the whole sequence."""
    if keep is not None:
        raise ValueError("an eviction edit cannot be combined with the caller's own keep")
    B, Tq, H, _ = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    if Tq != Tk:  # a cache: key 0 and the positions are not the window's own
        raise RuntimeError(
            f"an attention edit needs the whole sequence in one attention call; got {Tq} queries over {Tk} keys"
        )
    call = functools.partial(sink_attention, scale=scale, return_pattern=return_pattern, backend=backend)
    plan = None if edit.keep is None else edits.eviction_plan(window, edit, Tk)
    sliced = edit.knockout and edit.kv_heads is None and key_bias is None and Tq > 1  # with a bias: its -inf on key 0
    if sliced and (plan is None or plan.kind == "own"):
        return _knockout_by_slicing(call, q, k, v, sink, mask, window, return_lse)
    bias = key_bias
    if edit.knockout:
        bias = edits.knockout_bias(key_bias, B, Hkv, Tk, edit.kv_heads, q.device)
    if plan is None or plan.kind == "own":
        res = call(q, k, v, sink=sink, key_bias=bias, mask=mask, window=window, return_lse=return_lse)
    else:
        rule = dict(window=plan.window, keep=plan.keep if plan.kind == "rule" else None)
        if mask is not None:  # an additive mask (HF's dense one) replaces the rule: the rule joins it
            visible = visible_mask(Tq, rule["window"], q.device, Tk, rule["keep"])
            rule = dict(mask=mask.float().masked_fill(~visible, float("-inf")), window=None, keep=None)
        if plan.kind == "rule":
            res = call(q, k, v, sink=sink, key_bias=bias, return_lse=return_lse, **rule)
        else:
            recording = torch.is_grad_enabled() and any(
                t is not None and t.requires_grad for t in (q, k, v, sink, key_bias)
            )  # the merge needs the window part's lse with its gradient: the reference gives both
            res = call(
                q,
                k,
                v,
                sink=sink,
                key_bias=bias,
                return_lse=return_lse,
                **rule,
                **({"backend": "reference"} if recording else {}),
            )
            res = _with_full_lse(res, q, k, sink, bias, rule, scale, backend)
            res = kept.merge_kept(res, q, k, v, plan, rotary=edit.rotary, key_bias=bias, mask=mask, scale=scale)
    if not edit.knockout:
        return res
    empty = edits.empty_first_rows(sink, H, Hkv, edit.kv_heads, q.device)  # (H,)
    if not bool(empty.any()):
        return res
    first = _first_row(call, q, k, v, sink, key_bias, mask, return_lse)
    return _with_first_row(res, first, empty)


def _first_row(call, q, k, v, sink, key_bias, mask, return_lse) -> AttentionOutput:
    """Query 0 over key 0 alone: its clean row."""
    return call(
        q[:, :1],
        k[:, :1],
        v[:, :1],
        sink=sink,
        key_bias=None if key_bias is None else key_bias[..., :1],
        mask=None if mask is None else mask[..., :1, :1],
        return_lse=return_lse,
    )


def _with_full_lse(res, q, k, sink, key_bias, rule, scale, backend) -> AttentionOutput:
    """``res`` with its lse over every key and the phantom (paths that do not give it: SDPA off the CPU)."""
    if res.lse is not None:
        return res
    real = res.lse_real
    if real is None:
        real = real_lse(q, k, sink, key_bias, rule.get("mask"), rule["window"], scale, rule["keep"], backend)
    lse = real if sink is None else torch.logaddexp(real.float(), sink.float()[None, :, None])
    return res._replace(lse=lse)


def _knockout_by_slicing(call, q, k, v, sink, mask, window, return_lse) -> AttentionOutput:
    """Key 0 out of every KV head of an op without a key bias: the op on queries and keys 1 .. T-1, whose rule is the
    same less key 0 (no bias coordinate, no copy). Query 0 keeps its clean row where it has no phantom; with one, its
    mass is the phantom's."""
    res = call(
        q[:, 1:],
        k[:, 1:],
        v[:, 1:],
        sink=sink,
        mask=None if mask is None else mask[..., 1:, 1:],
        window=window,
        return_lse=return_lse,
    )
    first = _first_row(call, q, k, v, sink, None, mask, return_lse)
    H, T = q.shape[2], q.shape[1]
    empty = torch.ones(H, dtype=torch.bool, device=q.device) if sink is None else torch.isneginf(sink.float())
    out0 = torch.where(empty[None, :, None], first.out[:, 0], torch.zeros_like(first.out[:, 0]))
    out = torch.cat([out0[:, None].to(res.out.dtype), res.out], 1)

    def rows(row0, rest):  # (B, H, 1) and (B, H, T-1) -> (B, H, T)
        return None if rest is None or row0 is None else torch.cat([row0.to(rest.dtype), rest], -1)

    no_key = torch.full_like(first.out[:, 0, :, 0], float("-inf"), dtype=torch.float32)  # (B, H)
    lse0 = None if first.lse is None else first.lse[..., 0]  # a head with a phantom: its lse is the sink logit
    if lse0 is not None and sink is not None:
        lse0 = torch.where(empty[None], lse0, sink.to(lse0.dtype)[None])
    real0 = None if first.lse_real is None else torch.where(empty[None], first.lse_real[..., 0], no_key)
    pattern, phantom = None, None
    if res.pattern is not None and first.pattern is not None and first.phantom is not None:
        pattern = res.pattern.new_zeros(*res.pattern.shape[:2], T, T)
        pattern[..., 1:, 1:] = res.pattern
        pattern[..., 0, 0] = torch.where(empty[None], first.pattern[..., 0, 0], 0.0)
        phantom = rows(torch.where(empty[None], first.phantom[..., 0], 1.0)[..., None], res.phantom)
    return AttentionOutput(
        out,
        rows(None if lse0 is None else lse0[..., None], res.lse),
        pattern,
        phantom,
        rows(None if real0 is None else real0[..., None], res.lse_real),
    )


def _with_first_row(res, first, empty):
    """``res`` with query 0 of the heads marked ``empty`` (H,) taken from ``first`` (that query's clean 1 x 1 call)."""
    out = res.out.clone()
    out[:, 0] = torch.where(empty[None, :, None], first.out[:, 0].to(out.dtype), res.out[:, 0])
    lse, pattern, phantom, real = res.lse, res.pattern, res.phantom, res.lse_real
    if lse is not None and first.lse is not None:
        lse = lse.clone()
        lse[:, :, 0] = torch.where(empty[None], first.lse[:, :, 0], res.lse[:, :, 0])
    if real is not None:
        real = real.clone()
        real[:, :, 0] = torch.where(empty[None], first.lse_real[:, :, 0], res.lse_real[:, :, 0])
    if pattern is not None:
        pattern, phantom = pattern.clone(), phantom.clone()
        pattern[:, :, 0, 0] = torch.where(empty[None], first.pattern[:, :, 0, 0], res.pattern[:, :, 0, 0])
        phantom[:, :, 0] = torch.where(empty[None], first.phantom[:, :, 0], res.phantom[:, :, 0])
    return AttentionOutput(out, lse, pattern, phantom, real)
