"""The attention function the HF adapters install (transformers ``AttentionInterface`` name ``"probe"``), and the mask
builder that goes with it (``AttentionMaskInterface`` of the same name).

transformers 5 calls ``fn(module, query, key, value, attention_mask, scaling=..., dropout=..., sliding_window=...,
s_aux=...)`` after the projections and rotary, with q (B,H,Tq,dh), k/v (B,Hkv,Tk,dh). Here the attention hooks
fire:

    [hook_q], hook_rot_q, [hook_k], hook_rot_k, hook_v, hook_v_out, [hook_sink_logit], [hook_attn_scores],
    [hook_pattern, hook_phantom, hook_pattern_norm], [hook_lse], hook_z

all with positions second (B,T,heads,dh). hook_q / hook_k (the projections' output) and hook_q_normed / hook_k_normed
fire from forward hooks on the attention module's own projection and QK-norm modules (:func:`qk_plan`; here only for
a fused QKV projection), hook_result from one on its output projection (:func:`result_hook`).

No T x T tensor (docs/definitions.md#long-context): when HF's mask is only causal or a sliding window (plus key
padding), :func:`rules_mask` hands the attention function a :class:`MaskRules` (the window and, with padding, the
(B, Tk) keys to keep) instead of transformers' dense B x 1 x T x T float mask, and
the kernels (probe.kernels: the same op and reference the custom models use) apply the rule themselves: causal layers
on the fused causal op, sliding layers and padded batches in query blocks whose mask is block x (keys the block can
see). A dense mask is built only where the rule cannot say it (a cache offset, overlays such as Gemma 3's image
tokens, a 4D mask the caller passed), as transformers' ``eager_mask``, and on DeepSeek-V4's compressed layers, whose
C compressed KV entries follow the T token keys with a visibility of their own (:func:`split_extra_keys`): there the
mask is B x 1 x T x (T + C), the token keys' rule beside HF's block bias (docs/definitions.md#compressed-keys).

The pattern (fp32, the learned sink as the phantom whose mass is 1 − row sum) is materialised only when a hook or
cache asks for ``hook_pattern`` / ``hook_phantom`` / ``hook_attn_scores`` / ``hook_pattern_norm``, the caller passed
``output_attentions=True``, dropout is active, or the adapter is materialising (``probe.materialize(model)`` /
``materialize_patterns``); otherwise the fused op computes the same output on the runtime backend. An attention
module that no adapter hooked runs the same math without hooks.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask, prepare_padding_mask

from probe.hooks.fire import fire
from probe.kernels import sink_attention
from probe.kernels.sink_attention import edits
from probe.kernels.sink_attention.reference import attention_scores, pattern_norms, probs_of_scores, scores_of_probs

try:  # where transformers collects attentions for output_attentions=True (an internal: absent in other versions)
    from transformers.utils.output_capturing import _active_collector
except ImportError:  # pragma: no cover
    _active_collector = None

ATTN_IMPLEMENTATION = "probe"

# key in an HF attention module's __dict__ holding the adapter's hook container for that layer (hooked_hf._AttnHooks);
# a plain attribute, not a submodule, so state dicts are unchanged and deep copies stay consistent
SITE_KEY = "_probe_attn"

# keywords transformers' attention call sites pass that do not change what eager attention computes: cache and
# position plumbing, output switches, and packed-sequence metadata whose effect the mask already carries
PASSIVE_KWARGS = frozenset(
    {
        "position_ids",
        "cache_position",
        "use_cache",
        "past_key_values",
        "past_key_value",
        "position_embeddings",
        "output_attentions",
        "output_hidden_states",
        "output_router_logits",
        "return_dict",
        "cu_seq_lens_q",
        "cu_seq_lens_k",
        "max_length_q",
        "max_length_k",
    }
)

MIN_BLOCK = 256  # queries per block on the blocked paths (at least the window: a block then reads <= 2 windows of keys)
PADDED_BLOCK_ELEMENTS = 1 << 22  # B x block x Tk mask elements per block when key padding needs a dense mask


def _bthd(x):  # (B,H,T,dh) <-> (B,T,H,dh)
    return x.transpose(1, 2)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(B,Hkv,T,dh) -> (B,Hkv*n_rep,T,dh), query head h reading KV head h // n_rep (HF's GQA layout)."""
    if n_rep == 1:
        return x
    b, hkv, t, dh = x.shape
    return x[:, :, None].expand(b, hkv, n_rep, t, dh).reshape(b, hkv * n_rep, t, dh)


# --- masks as rules ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MaskRules:
    """HF's attention mask as a rule: key j is visible to query i (queries the last Tq of Tk positions, i' = i + Tk
    − Tq) iff i' − window < j <= i' (window None: j <= i') and ``keep[b, j]``. keep (B, Tk) bool or None (no
    padding)."""

    window: int | None = None
    keep: torch.Tensor | None = None

    def visible(self, rows: slice, q_len: int, k_len: int, device) -> torch.Tensor:
        """(B|1, 1, rows, Tk) bool for the queries ``rows`` (a slice or list of indices into range(q_len))."""
        i = torch.arange(q_len, device=device)[rows, None] + (k_len - q_len)
        j = torch.arange(k_len, device=device)[None, :]
        ok = j <= i
        if self.window is not None:
            ok = ok & (j > i - self.window)
        ok = ok[None, None]
        return ok if self.keep is None else ok & self.keep[:, None, None, :k_len].to(device)

    def dense(self, rows: slice, q_len: int, k_len: int, dtype, device) -> torch.Tensor:
        """The additive mask of those rows, with transformers' eager values (0, or the min of ``dtype``): fp32, fp64
        for fp64 (fp64's min does not fit in fp32)."""
        allowed = self.visible(rows, q_len, k_len, device)
        wide = torch.promote_types(dtype, torch.float32)
        return torch.zeros(allowed.shape, dtype=wide, device=device).masked_fill(~allowed, torch.finfo(dtype).min)


def _follows_rule(mask_function, length: int, window: int | None, device) -> bool:
    """Does transformers' index-based ``mask_function`` say causal (window None) or causal within ``window`` on the
    rows where the two rules differ from other patterns (first rows, around the window's edge, the last row)? O(T)."""
    w = window or 1
    rows = sorted({r for r in (0, 1, w - 1, w, w + 1, length // 2, length - 1) if 0 <= r < length})
    q = torch.tensor(rows, device=device)[:, None]
    kv = torch.arange(length, device=device)[None, :]
    zero = torch.zeros((), dtype=torch.long, device=device)
    try:
        got = mask_function(zero, zero, q, kv)
    except Exception:  # noqa: BLE001 - a mask function that is not index-based: keep transformers' dense mask
        return False
    want = MaskRules(window).visible(rows, length, length, device)[0, 0]
    return isinstance(got, torch.Tensor) and got.shape == want.shape and bool(torch.equal(got.bool(), want))


def rules_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset=0,
    kv_offset=0,
    mask_function=None,
    attention_mask=None,
    local_size: int | None = None,
    allow_is_causal_skip: bool = True,
    **kwargs,
):
    """transformers mask builder for ``"probe"``: a :class:`MaskRules` when the mask is causal or a sliding window
    (with any key padding) over one sequence without a cache offset, else transformers' dense ``eager_mask``.

    transformers sets ``allow_is_causal_skip`` False when an overlay, packed sequences or a compiled decode change
    the pattern; the mask function itself is checked against the rule too (:func:`_follows_rule`)."""
    device = kwargs.get("device", "cpu")
    plain = (
        allow_is_causal_skip
        and isinstance(q_offset, int)
        and q_offset == 0
        and kv_offset == 0
        and q_length == kv_length
        and mask_function is not None
        and _follows_rule(mask_function, q_length, local_size, device)
    )
    if not plain:
        if mask_function is not None:
            kwargs["mask_function"] = mask_function
        return eager_mask(
            batch_size=batch_size,
            q_length=q_length,
            kv_length=kv_length,
            q_offset=q_offset,
            kv_offset=kv_offset,
            attention_mask=attention_mask,
            local_size=local_size,
            **kwargs,
        )
    keep = prepare_padding_mask(attention_mask, kv_length, kv_offset)
    if keep is not None:
        keep = keep[:, :kv_length].bool()
        if bool(keep.all()):
            keep = None
    return MaskRules(window=local_size, keep=keep)


def as_rules(attention_mask, sliding_window: int | None, q_len: int, k_len: int, device):
    """The mask an attention function received, as (MaskRules, None) or (None, dense additive fp32 mask). HF's None
    means causal (SDPA's is_causal) within the module's ``sliding_window``; a bool mask is made additive."""
    if isinstance(attention_mask, MaskRules):
        return attention_mask, None
    if attention_mask is None:
        return MaskRules(window=sliding_window), None
    if attention_mask.dtype == torch.bool:
        return None, torch.zeros(attention_mask.shape, device=device).masked_fill(~attention_mask, float("-inf"))
    return None, attention_mask[..., :k_len].float()


def query_blocks(rules: MaskRules, q_len: int, k_len: int, dtype, device, block: int | None = None):
    """Yield (query rows, key columns, mask) covering the queries in blocks, never a q_len x k_len tensor: without
    padding a block reads only the keys its rule can see and mask is None (the kernels apply the rule, queries last);
    with padding it reads every key and mask is its (B, 1, block, Tk) additive rows (eager's values, so rows whose
    keys are all padding stay uniform as in transformers)."""
    if rules.keep is None:
        block = block or max(MIN_BLOCK, rules.window or 0)
        off = k_len - q_len
        for a in range(0, q_len, block):
            b = min(q_len, a + block)
            j0 = 0 if rules.window is None else max(0, a + off - rules.window + 1)
            yield slice(a, b), slice(j0, b + off), None
        return
    block = block or max(1, PADDED_BLOCK_ELEMENTS // (rules.keep.shape[0] * k_len))
    for a in range(0, q_len, block):
        rows = slice(a, min(q_len, a + block))
        yield rows, slice(0, k_len), rules.dense(rows, q_len, k_len, dtype, device)


# --- attention ----------------------------------------------------------------------------------------------------


def eager_probs(
    q,
    k,
    mask,
    scaling: float,
    sinks=None,
    window: int | None = None,
    softcap: float | None = None,
    key_bias=None,
    scores_hook=None,
):
    """fp32 attention probabilities over real keys and the phantom (sink) mass: the kernels' reference.

    q (B,H,Tq,dh), k (B,H,Tk,dh) already repeated to H heads, mask additive (broadcastable to B,H,Tq,Tk) or None
    (causal within ``window``), sinks (H,) logits or None, softcap Gemma 2's score cap, key_bias (B,H,Tk) added to
    each key's logit (ALiBi) or None. ``scores_hook``: hook_attn_scores, fired on the scores (B,H,Tq,Tk) the pattern
    is then taken from (an edit of them reaches it). Returns pattern (B,H,Tq,Tk),
    phantom (B,H,Tq) and the lse over the real keys (B,H,Tq, docs/definitions.md#row-log-normaliser); rows sum to
    1 - phantom.
    """
    scores = attention_scores(
        _bthd(q), _bthd(k), key_bias=key_bias, mask=mask, window=window, scale=scaling, softcap=softcap
    )
    if scores_hook is not None:
        scores = scores_hook(scores)
    pattern, phantom, lse = probs_of_scores(scores, sinks)
    if sinks is None and mask is not None:
        pattern = spread_hidden_rows(scores, pattern)
    real = lse if sinks is None else lse + torch.log(pattern.sum(-1))  # the real mass, summed, not 1 - phantom
    return pattern, phantom, real


def spread_hidden_rows(scores: torch.Tensor, pattern: torch.Tensor) -> torch.Tensor:
    """The pattern with each row whose every key an additive mask hides (a left-padded sequence's pad queries: all
    its scores at about the dtype's min) spread evenly over the Tk keys, as transformers' softmax spreads it (and as
    the fused path computes it): exp(s - lse) gives each such key 1, a row summing to Tk, since lse = min + log Tk
    rounds to min. A row of -inf scores (no key at all) keeps its zero mass."""
    top = scores.amax(-1, keepdim=True)
    hidden = (top <= torch.finfo(scores.dtype).min / 2) & torch.isfinite(top)
    if not bool(hidden.any()):
        return pattern
    return pattern.masked_fill(hidden, 1.0 / scores.shape[-1])


def fire_scores_of(site, pattern, phantom, real, sinks):
    """hook_attn_scores where an attention edit made the pattern (the op carried it out): the scores it took, read back
    from its pattern and real-key lse; an edit of them re-makes (pattern, phantom, real lse) from the edited scores."""
    if site is None or not wants_scores(site):
        return pattern, phantom, real
    scores = scores_of_probs(pattern, real - torch.log(pattern.sum(-1)))  # the row's whole normaliser
    fired, edited = fire(site.hook_attn_scores, scores)
    if not edited:
        return pattern, phantom, real
    pattern, phantom, lse = probs_of_scores(fired, sinks)
    return pattern, phantom, (lse if sinks is None else lse + torch.log(pattern.sum(-1)))


def edited_probs(q, k, v, mask, scaling: float, sinks=None, window: int | None = None, key_bias=None, *, edit):
    """:func:`eager_probs` under ``edit``, which the kernels' reference op carries out: (pattern, phantom, lse
    over the real keys); q (B,H,Tq,dh), k/v (B,Hkv,Tk,dh)."""
    res = sink_attention(
        _bthd(q),
        _bthd(k),
        _bthd(v),
        sink=sinks,
        key_bias=key_bias,
        mask=mask,
        window=window,
        scale=scaling,
        return_pattern=True,
        backend="reference",
        edit=edit,
    )
    real = res.lse if sinks is None else res.lse + torch.log(res.pattern.sum(-1))
    return res.pattern, res.phantom, real


def refuse_padded_edit(rules: MaskRules | None, edit, mask=None) -> None:
    """An attention edit on padded sequences is an error: key 0 and the positions are not each sequence's own. A dense
    additive ``mask`` (the families that build their own: Falcon, MPT) counts as padded where it hides a query's own
    position (a pad key)."""
    if edit is None:
        return
    padded = rules.keep is not None if rules is not None else mask is not None and _hides_own_key(mask)
    if padded:
        raise RuntimeError(
            "an attention edit (knockout, eviction) needs unpadded sequences: with key padding key 0 and the "
            "positions are not each sequence's own; pass windows without an attention mask"
        )


def _hides_own_key(mask: torch.Tensor) -> bool:
    """Does the additive mask (B|1, 1|H, Tq, Tk) hide some query's own position from it? Key padding does (a pad
    key is hidden from every query, its own included); a causal, windowed or chunked mask never does."""
    q_len, k_len = mask.shape[-2:]
    own = mask.diagonal(offset=k_len - q_len, dim1=-2, dim2=-1)  # ..., Tq: query i's entry for its own key
    return bool((own <= torch.finfo(torch.float32).min / 2).any())  # transformers' min of the dtype, or -inf


def fast_attention(
    q, k, v, mask, scaling: float, sinks=None, window: int | None = None, return_lse=False, key_bias=None, edit=None
):
    """(output (B,H,Tq,dh), lse over the real keys (B,H,Tq) fp32 or None) without materialising the pattern: the
    kernels' fused op (SDPA with the sink as an extra key of value 0 on CPU), GQA without repetition; q (B,H,Tq,dh),
    k/v (B,Hkv,Tk,dh); mask additive or None (causal within ``window``, queries the last Tq positions). The lse only
    with ``return_lse`` (free where the fused kernel has it, docs/definitions.md#row-log-normaliser); ``edit``: an
    attention edit the op carries out (probe.kernels.sink_attention.edits)."""
    res = sink_attention(
        _bthd(q),
        _bthd(k),
        _bthd(v),
        sink=sinks,
        key_bias=key_bias,
        mask=mask,
        window=window,
        scale=scaling,
        return_lse=return_lse,
        edit=edit,
    )
    return _bthd(res.out), res.lse_real


def rules_attention(q, k, v, rules: MaskRules, scaling: float, sinks=None, return_lse=False, key_bias=None, edit=None):
    """:func:`fast_attention` under a :class:`MaskRules`, with no T x T tensor: causal or a sliding window in one call
    of the kernels (whose windowed paths run in query blocks of their own, so ``edit`` acts on every query),
    padded keys in query blocks (:func:`query_blocks`), where an edit is refused."""
    q_len, k_len = q.shape[2], k.shape[2]
    if rules.keep is None:
        return fast_attention(q, k, v, None, scaling, sinks, rules.window, return_lse, key_bias, edit)
    refuse_padded_edit(rules, edit)
    out = q.new_empty(*q.shape[:3], v.shape[-1])
    lse = q.new_empty(*q.shape[:3], dtype=torch.float32) if return_lse else None  # (B, H, Tq)
    for rows, cols, mask in query_blocks(rules, q_len, k_len, q.dtype, q.device):
        out[:, :, rows], block_lse = fast_attention(
            q[:, :, rows],
            k[:, :, cols],
            v[:, :, cols],
            mask,
            scaling,
            sinks,
            None if mask is not None else rules.window,
            return_lse,
            None if key_bias is None else key_bias[..., cols],
        )
        if lse is not None:
            lse[:, :, rows] = block_lse
    return out, lse


def _hf_wants_attentions() -> bool:
    """True inside a transformers forward called with ``output_attentions=True``."""
    collected = None if _active_collector is None else _active_collector.get()
    return isinstance(collected, dict) and "attentions" in collected


def wants_pattern(site, module, dropout: float) -> bool:
    """Materialise the pattern? When a hook or cache reads it, the adapter materialises, HF was asked for the
    attentions, or dropout acts on the probabilities."""
    hooked = site is not None and (site.materialize or site.hook_pattern.has_hooks() or site.hook_phantom.has_hooks())
    return (
        hooked
        or wants_scores(site)
        or wants_pattern_norm(site)
        or (module.training and dropout > 0)
        or _hf_wants_attentions()
    )


def wants_pattern_norm(site) -> bool:
    """Fire hook_pattern_norm? Where the layer has it (an output projection) and a hook reads it or the adapter is
    materialising."""
    point = getattr(site, "hook_pattern_norm", None)
    return point is not None and (site.materialize or point.has_hooks())


def fire_pattern_norm(site, pattern: torch.Tensor, value: torch.Tensor) -> None:
    """hook_pattern_norm (B,H,Tq,Tk) = ||a_ij v_j W_O[h]|| of the pattern the output is aggregated with and the value
    (B,Hkv,Tk,dv), through the output projection's weight (docs/definitions.md#norm-weighted-attention); a read-out,
    its edit changes nothing."""
    if not wants_pattern_norm(site):
        return
    out = site.out_proj
    w = out.weight if isinstance(out, torch.nn.Linear) else out.weight.T  # (d, H·dv); GPT-2's Conv1D is (H·dv, d)
    site.hook_pattern_norm(pattern_norms(pattern, _bthd(value), w))


def wants_scores(site) -> bool:
    """Fire hook_attn_scores? When a hook or cache reads it, or the adapter is materialising (the scores are then
    taken on the pattern's path)."""
    return site is not None and (site.materialize or site.hook_attn_scores.has_hooks())


def wants_lse(site) -> bool:
    """Compute each row's real-key lse? When a hook or cache reads ``hook_lse`` or the adapter is materialising (what
    nnsight reads)."""
    return site is not None and (site.materialize or site.hook_lse.has_hooks())


def fire_qkv(site, query, key, value, position_ids=None, position_embeddings=None):
    """hook_rot_q, hook_rot_k (and hook_q / hook_k where the attention function is where they are seen: see
    :func:`fire_rot`), hook_v, hook_v_out on (B,H,T,dh) tensors (positions second inside the hooks).
    ``position_ids`` (B,T) / ``position_embeddings`` (HF's (cos, sin)): where the caller passes them, the positions
    the rotary turned q and k by (else 0 .. T-1)."""
    if site is None:
        return query, key, value
    same = query.shape[2] == key.shape[2]  # no cache: keys at the queries' positions
    rotary = {"positions": position_ids, "embeddings": position_embeddings} if same else {}
    if key.untyped_storage().data_ptr() == value.untyped_storage().data_ptr():  # one tensor read as both keys and
        value = value.clone()  # values (DeepSeek-V4's shared KV): an in-place edit of one stays its own
    query = _bthd(fire_rot(site, "q", _bthd(query), **rotary))
    key = _bthd(fire_rot(site, "k", _bthd(key), **rotary))
    value = _bthd(site.hook_v_out(site.hook_v(_bthd(value))))
    return query, key, value


# --- the query and key before rotary ------------------------------------------------------------------------------
# The attention function sees q and k after QK-norm and rotary (hook_rot_q / hook_rot_k). hook_q / hook_k (the
# projection's output) and hook_q_normed / hook_k_normed (QK-norm's) fire from forward hooks on the attention
# module's own projection and norm modules where it has them ("module"); a fused QKV projection without them gives
# them here: without rotary hook_q is hook_rot_q ("same"), with rotate-half rotary it is hook_rot_q turned back by the
# layer's own tables ("unrotate"); anything else leaves them absent (docs/definitions.md#hook-namespace).

ROUTE_MODULE, ROUTE_SAME, ROUTE_UNROTATE = "module", "same", "unrotate"
PROJECTION_KEY = "_probe_projection"  # q_proj / k_proj / QK-norm / output projection __dict__ -> (site, role)
# (query, key) projections and QK-norms; DeepSeek-V4: q_b_proj after a low-rank q_a_proj, one kv_proj for both K and V
QK_PROJECTIONS = (("q_proj", "k_proj"), ("q_b_proj", "kv_proj"))
QK_NORMS = (
    ("q_norm", "k_norm"),
    ("q_layernorm", "k_layernorm"),
    ("query_layernorm", "key_layernorm"),
    ("q_b_norm", "kv_norm"),
)
OUT_PROJECTIONS = ("o_proj", "out_proj", "dense", "c_proj", "Wo")
ROTARY_CALL = re.compile(r"apply_rotary|rotary_emb\(|apply_rope|rotate_half\(")
ROTARY_WORDS = re.compile(r"rotary|rotate_half|rotate_every_two|\brope\b|_rope_|rope_", re.IGNORECASE)


def _turn(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sign: float) -> torch.Tensor:
    """Rotate-half rotary of x (B,T,heads,dh) over its first 2·d_rot/2 coordinates by +angle (sign 1) or its inverse
    (sign -1); cos/sin (T, d_rot/2) or (B, T, d_rot/2), in fp32 at least, may carry the rotary's attention scaling
    (YaRN's mscale: cos² + sin² = scaling², which the inverse divides out)."""
    half = cos.shape[-1]
    wide = torch.promote_types(x.dtype, torch.float32)
    rot, rest = x[..., : 2 * half].to(wide), x[..., 2 * half :]
    a, b = rot[..., :half], rot[..., half:]
    c, s = cos.to(wide)[..., None, :], sign * sin.to(wide)[..., None, :]  # (.., T, 1, half) over heads
    turned = torch.cat([a * c - b * s, b * c + a * s], dim=-1)
    if sign < 0:
        turned = turned / (c * c + s * s).repeat(*([1] * (c.dim() - 1)), 2)
    return torch.cat([turned.to(x.dtype), rest], dim=-1)


def _tables_at(site, positions, length: int, embeddings=None):
    """(cos, sin) of the layer's rotary at ``positions`` (B,T) or 0 .. length-1: (T, d_rot/2) or (B, T, d_rot/2); HF's
    own (cos, sin) (B,T,d_rot: rotate-half's halves equal) where given."""
    if embeddings is not None and embeddings[0].shape[-2] == length:
        return tuple(t[..., : t.shape[-1] // 2] for t in embeddings)
    if positions is None:
        return site.rotary(length)
    cos, sin = site.rotary(int(positions.max()) + 1)
    return cos[positions], sin[positions]


def fire_rot(site, which: str, x: torch.Tensor, positions=None, embeddings=None) -> torch.Tensor:
    """x (B,T,heads,dh) as the scores take it through hook_rot_{which}; before it, hook_{which} where this function
    is where it is seen (``site.qk_route``): the same tensor without rotary, or x turned back by the layer's rotary
    (only when hooked; an edit is turned forward again, an unedited x passes unchanged)."""
    route = site.qk_route
    if route == ROUTE_SAME:
        x = getattr(site, f"hook_{which}")(x)
    elif route == ROUTE_UNROTATE and getattr(site, f"hook_{which}").has_hooks():
        cos, sin = _tables_at(site, positions, x.shape[1], embeddings)
        before = _turn(x, cos, sin, -1.0)
        fired, edited = fire(getattr(site, f"hook_{which}"), before)
        if edited:
            x = _turn(fired, cos, sin, 1.0)
    return getattr(site, f"hook_rot_{which}")(x)


def _modeling_source(attn) -> tuple[str, str]:
    """(the attention module's forward source, its modeling file's source); empty where not readable."""
    try:
        forward = inspect.getsource(type(attn).forward)
    except (OSError, TypeError):
        forward = ""
    module = inspect.getmodule(type(attn))
    try:
        whole = inspect.getsource(module) if module is not None else ""
    except (OSError, TypeError):
        whole = ""
    return forward, whole


def _linear_like(module) -> bool:
    weight = getattr(module, "weight", None)
    return isinstance(module, torch.nn.Module) and isinstance(weight, torch.Tensor) and weight.dim() == 2


def qk_norms(attn, forward_source: str) -> tuple | None:
    """The attention's QK-norm modules (q, k), where it has a pair of its own applied before rotary; None else (no
    QK-norm, one module for both, or a norm after rotary: HunYuan, Llama 4 have no tensor between)."""
    for q_name, k_name in QK_NORMS:
        qn, kn = getattr(attn, q_name, None), getattr(attn, k_name, None)
        if not isinstance(qn, torch.nn.Module) or not isinstance(kn, torch.nn.Module) or qn is kn:
            continue
        at = forward_source.find(f"self.{q_name}(")
        rotary = ROTARY_CALL.search(forward_source)
        if at >= 0 and (rotary is None or at < rotary.start()):
            return qn, kn
        return None
    return None


def qk_plan(attn, has_tables: bool) -> dict:
    """How a layer's hook_q / hook_k (and QK-norm's hooks) fire: {"route": module | same | unrotate | None,
    "projections": (q_proj, k_proj) or None (the norms' inputs give hook_q / hook_k), "norms": (q_norm, k_norm) or
    None}. A fused QKV projection's query is read in the attention function: as it is without rotary, turned back
    where the layer's rotary is rotate-half with tables (``has_tables``), else nowhere."""
    forward, whole = _modeling_source(attn)
    norms = qk_norms(attn, forward)
    found = (tuple(getattr(attn, n, None) for n in pair) for pair in QK_PROJECTIONS)
    projections = next((pair for pair in found if all(_linear_like(p) for p in pair)), None)
    if projections is not None:
        return {"route": ROUTE_MODULE, "projections": projections, "norms": norms}
    if norms is not None:  # a fused projection: QK-norm's input is the projection's query (Persimmon)
        return {"route": ROUTE_MODULE, "projections": None, "norms": norms}
    if whole and not ROTARY_WORDS.search(whole):
        return {"route": ROUTE_SAME, "projections": None, "norms": None}
    return {"route": ROUTE_UNROTATE if has_tables else None, "projections": None, "norms": None}


def out_projection(attn):
    """The attention's output projection (a Linear, or GPT-2's Conv1D), whose input is the heads' outputs side by
    side; None where it has none of the known names (JetMoe's mixture of attention heads)."""
    for name in OUT_PROJECTIONS:
        module = getattr(attn, name, None)
        if _linear_like(module):
            return module
    return None


def _as_heads(x: torch.Tensor, heads: int, dh: int, gated: bool = False):
    """(x as B,T,heads,dh, the function putting such a tensor back in x's layout), or None for a layout not
    known. Layouts: (B,T,heads·dh) a projection's output (gated: Qwen3-Next's query and gate per head, the query
    first), (B,T,heads,dh), or (B,heads,T,dh) (transposed before the norm: Gemma 3, Cohere 2)."""
    if x.dim() == 3 and x.shape[-1] == heads * dh * (2 if gated else 1):
        if not gated:
            return x.view(*x.shape[:2], heads, dh), lambda y: y.reshape(x.shape)
        both = x.view(*x.shape[:2], heads, 2 * dh)  # B,T,H,2dh: query | gate
        return both[..., :dh], lambda y: torch.cat([y, both[..., dh:]], dim=-1).reshape(x.shape)
    if x.dim() != 4 or x.shape[-1] != dh or heads not in x.shape[1:3]:
        return None
    transposed = x.shape[1] == heads and (x.shape[2] != heads or x.stride(1) < x.stride(2))
    if transposed:
        return x.transpose(1, 2), lambda y: y.transpose(1, 2)
    return x, lambda y: y


def _fire_as_heads(site, role: str, x: torch.Tensor):
    """hook_{role} on x seen as B,T,heads,dh, returned in x's layout (None: not hooked, or x unchanged)."""
    hook = getattr(site, f"hook_{role}", None)
    if hook is None or not hook.has_hooks() or site.heads is None:
        return None
    H, Hkv, dh = site.heads
    heads = H if role.startswith("q") else Hkv
    seen = _as_heads(x, heads, dh, gated=site.query_gated and role == "q")
    if seen is None:
        raise RuntimeError(f"{type(site).__name__} cannot read hook_{role} from a tensor of shape {tuple(x.shape)}")
    bthd, back = seen
    fired, edited = fire(hook, bthd)
    return back(fired) if edited else None


def projection_hook(module, _inputs, output):
    """Forward hook on q_proj / k_proj (role q / k) and on QK-norm modules (q_normed / k_normed): their output
    through the hook; an edit replaces it."""
    entry = module.__dict__.get(PROJECTION_KEY)
    return None if entry is None else _fire_as_heads(entry[0], entry[1], output)


def norm_input_hook(module, args):
    """Forward pre-hook on a QK-norm module of a fused projection (role q / k): its input, the projection's query
    or key, through hook_q / hook_k; an edit replaces it."""
    entry = module.__dict__.get(PROJECTION_KEY + "_in")
    if entry is None or not args:
        return None
    fired = _fire_as_heads(entry[0], entry[1], args[0])
    return None if fired is None else (fired,) + tuple(args[1:])


def result_hook(module, inputs, output):
    """Forward hook on the output projection: hook_result (B,T,H,d), each head's write z_h W_O[h], only when hooked
    (or materialising); an edit makes the output Σ_h result_h + b_O, an unedited result leaves HF's output as it
    is."""
    entry = module.__dict__.get(PROJECTION_KEY)
    site = None if entry is None else entry[0]
    if site is None or not (site.materialize or site.hook_result.has_hooks()) or not inputs:
        return None
    x = inputs[0]  # B,T,H·dv
    H = site.heads[0] if site.heads is not None else site.info.n_heads
    w = module.weight  # Linear: (d, H·dv); GPT-2's Conv1D: (H·dv, d)
    if isinstance(module, torch.nn.Linear):
        result = torch.einsum("bthe,dhe->bthd", x.view(*x.shape[:2], H, -1), w.view(w.shape[0], H, -1))
    else:
        result = torch.einsum("bthe,hed->bthd", x.view(*x.shape[:2], H, -1), w.view(H, -1, w.shape[-1]))
    fired, edited = fire(site.hook_result, result)  # B,T,H,d
    if not edited:
        return None
    bias = getattr(module, "bias", None)
    return fired.sum(2) if bias is None else fired.sum(2) + bias


def hook_module(module, site, role: str, hook, pre: bool = False) -> None:
    """Point ``module`` at (site, role) and register ``hook`` once (a second adapter on the same model re-points)."""
    module.__dict__[PROJECTION_KEY + ("_in" if pre else "")] = (site, role)
    hooks = module._forward_pre_hooks if pre else module._forward_hooks
    if hook not in hooks.values():
        (module.register_forward_pre_hook if pre else module.register_forward_hook)(hook)


def install_qk_hooks(site, plan: dict) -> None:
    """Register the module hooks of a layer's :func:`qk_plan` on its modules (the points themselves are the
    site's)."""
    if plan["projections"] is not None:
        for role, module in zip(("q", "k"), plan["projections"]):
            hook_module(module, site, role, projection_hook)
    if plan["norms"] is not None:
        for which, module in zip(("q", "k"), plan["norms"]):
            hook_module(module, site, f"{which}_normed", projection_hook)
            if plan["projections"] is None:
                hook_module(module, site, which, norm_input_hook, pre=True)


def refuse_unknown(module, kwargs: dict) -> None:
    """One line naming the first keyword that would change the attention and that probe does not implement (a
    soft-cap, a bias, a non-causal mode, a sparse index): dropping it silently would compute another attention."""
    if getattr(module, "is_causal", True) is False:  # an encoder's (or a cross-) attention: not probe's causal rule
        raise ValueError(f"{type(module).__name__} is bidirectional (is_causal=False); probe hooks causal attention")
    for name, value in kwargs.items():
        if name in PASSIVE_KWARGS or value is None or (name == "is_causal" and value is True):
            continue
        shown = f"a {type(value).__name__}" if hasattr(value, "shape") else repr(value)
        raise ValueError(
            f"{type(module).__name__} passes the attention keyword {name}={shown}, which probe's attention function "
            f"({ATTN_IMPLEMENTATION!r}) does not implement; its hooks cannot reproduce this model's attention"
        )


def check_site(site, scaling: float, rules, query, key, softcap: float | None = None) -> None:
    """The attention a layer runs must be the one its ModelInfo describes (``info.attention_at(layer)``: the scale,
    soft-cap and window the streaming analyses rebuild scores with; the heads and head width): one line when a config
    feature changed it behind the adapter's back. A window of at least the keys there are is no window (a chunk or
    window longer than the sequence). query (B,H,Tq,dh), key (B,Hkv,Tk,dh)."""
    if site is None or site.info is None:
        return
    layer, k_len = site.layer, key.shape[2]
    described = site.info.attention_at(layer)
    got = {"scale": float(scaling), "softcap": softcap or None, "heads": (query.shape[1], key.shape[1], key.shape[-1])}
    want = {"scale": described.scale, "softcap": described.softcap, "heads": site.heads}
    if rules is not None:  # a dense mask (padding with a cache, an overlay) says no window; the rule does

        def effective(window):
            return None if window is None or window >= k_len else window

        got["window"], want["window"] = effective(rules.window), effective(described.window)
    for what, value in got.items():
        expected = want[what]
        if expected != value and not (
            isinstance(value, float) and isinstance(expected, float) and abs(value - expected) <= 1e-9 * abs(expected)
        ):
            raise ValueError(
                f"layer {layer} ran its attention with {what} {value!r}, but the adapter describes it with "
                f"{expected!r} (probe_info); a config option changes this model's attention in a way probe does not "
                f"follow"
            )


def split_extra_keys(site, key, value):
    """(token keys, token values, extra): where the layer's adapter appended entries after the token keys
    (DeepSeek-V4's compressed KV; its compressor hook leaves their visibility on the site, ``pending_keys``: an
    additive bias (B,1,Tq,C), 0 for an entry the query sees, -inf else), key / value (B,Hkv,T+C,dh) are split and
    extra is (entries' keys, entries' values, bias); else extra is None. The token keys go through the hooks as on
    any layer (the entries have theirs, the adapter's)."""
    bias = None if site is None else getattr(site, "pending_keys", None)
    if bias is None:
        return key, value, None
    site.pending_keys = None  # one attention call per layer forward
    n = key.shape[2] - bias.shape[-1]
    return key[:, :, :n], value[:, :, :n], (key[:, :, n:], value[:, :, n:], bias)


def join_extra_keys(query, key, value, rules, mask, extra, sinks=None, edit=None):
    """(keys, values, None, dense mask) with the extra entries appended after the token keys: the mask is the token
    keys' rule (or HF's mask) beside the entries' bias, (B,1|H,Tq,T+C) fp32, so hook_pattern's columns are the T
    token keys then the C entries (docs/definitions.md#compressed-keys). A knockout is carried out in that mask
    (:func:`knockout_columns`) and so is an eviction at the keys' positions in the text (it hides token keys only)."""
    if edit is not None and edit.keep is not None and edit.positions != "original":
        raise ValueError(
            f"window eviction at {edit.positions} positions on a layer with compressed KV entries is not supported: "
            "the entries are keys at no token position; use positions original"
        )
    entries, values, bias = extra
    b, q_len, n = query.shape[0], query.shape[2], key.shape[2]
    tokens = rules.dense(slice(None), q_len, n, torch.float32, query.device) if rules is not None else mask
    tokens = tokens.float().expand(b, -1, q_len, n)
    if edit is not None and edit.keep is not None:  # query i sees keys 0 .. keep-1 and i-window+1 .. i, and its rule
        i = torch.arange(q_len, device=query.device)[:, None] + (n - q_len)
        j = torch.arange(n, device=query.device)[None, :]
        tokens = tokens.masked_fill(~((j < edit.keep) | (j > i - edit.window)), float("-inf"))
    mask = torch.cat([tokens, bias.float().expand(b, tokens.shape[1], q_len, -1)], dim=-1)
    if edit is not None and edit.knockout:
        mask = knockout_columns(mask, edit, sinks, query.shape[1], key.shape[1])
    return torch.cat([key, entries], dim=2), torch.cat([value, values], dim=2), None, mask


def knockout_columns(mask, edit, sinks, heads: int, kv_heads: int):
    """The dense mask (B,1|H,Tq,Tk) with key 0 out of every row of the knocked-out heads, (B,H,Tq,Tk): the knockout
    of probe.kernels.sink_attention.edits, query 0 of a head without a phantom keeping its clean row."""
    b, _, q_len, k_len = mask.shape
    knocked = torch.zeros(kv_heads, dtype=torch.bool, device=mask.device)
    knocked[list(range(kv_heads)) if edit.kv_heads is None else list(edit.kv_heads)] = True
    knocked = knocked.repeat_interleave(heads // kv_heads)  # (H,)
    empty = edits.empty_first_rows(sinks, heads, kv_heads, edit.kv_heads, mask.device)  # (H,) row 0 kept clean
    rows = torch.ones(heads, q_len, dtype=torch.bool, device=mask.device)
    rows[:, 0] = ~empty
    mask = mask.expand(b, heads, q_len, k_len).clone()
    mask[..., 0] = mask[..., 0].masked_fill((knocked[:, None] & rows)[None], float("-inf"))
    return mask


def probe_attention(
    module,
    query,
    key,
    value,
    attention_mask,
    scaling=None,
    dropout=0.0,
    sliding_window=None,
    s_aux=None,
    key_bias=None,
    **kwargs,
):
    """transformers attention function: fires the attention hooks of the layer that owns ``module``. ``key_bias``
    (B,Hkv,Tk): a logit added to each key (ALiBi's per-head slope times the key's position), passed by the adapters
    of families that compute their attention themselves; transformers' call sites never pass it."""
    refuse_unknown(module, kwargs)
    site = module.__dict__.get(SITE_KEY)
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    sinks = s_aux
    key, value, extra = split_extra_keys(site, key, value)  # DeepSeek-V4's compressed KV after the token keys
    query, key, value = fire_qkv(site, query, key, value, kwargs.get("position_ids"), kwargs.get("position_embeddings"))
    edit = edits.taken(None if site is None else site.hook_v_out)  # handed to this layer's op by a hook on hook_v_out
    if site is not None and sinks is not None:
        if not hasattr(site, "hook_sink_logit"):
            raise ValueError(f"{type(module).__name__} passes sink logits, but its adapter describes no phantom key")
        sinks = site.hook_sink_logit(sinks)
    training = module.training and dropout > 0
    q_len, k_len = query.shape[2], key.shape[2]
    rules, mask = as_rules(attention_mask, sliding_window, q_len, k_len, query.device)
    check_site(site, scaling, rules, query, key)
    if extra is not None:
        key, value, rules, mask = join_extra_keys(query, key, value, rules, mask, extra, sinks, edit)
        k_len, edit = key.shape[2], None  # a knockout is in the mask now

    weights, lse, want_lse = None, None, wants_lse(site)
    if wants_pattern(site, module, dropout):
        n_rep = query.shape[1] // key.shape[1]
        if rules is not None:  # the pattern is T x T by definition; its mask only where padding needs one
            mask = None if rules.keep is None else rules.dense(slice(None), q_len, k_len, query.dtype, query.device)
        window = rules.window if rules is not None and mask is None else None
        if edit is not None:  # the edit is carried out by the op, which gives the pattern too
            refuse_padded_edit(rules, edit, mask)
            pattern, phantom, lse = edited_probs(query, key, value, mask, scaling, sinks, window, key_bias, edit=edit)
            pattern, phantom, lse = fire_scores_of(site, pattern, phantom, lse, sinks)
        else:
            bias = None if key_bias is None else key_bias.repeat_interleave(n_rep, dim=1)
            hook = site.hook_attn_scores if wants_scores(site) else None
            pattern, phantom, lse = eager_probs(
                query, repeat_kv(key, n_rep), mask, scaling, sinks, window=window, key_bias=bias, scores_hook=hook
            )
        if site is not None:
            pattern = site.hook_pattern(pattern)
            phantom = site.hook_phantom(phantom)
            fire_pattern_norm(site, pattern, value)
        weights = pattern.to(query.dtype)
        probs = F.dropout(weights, p=dropout, training=True) if training else weights
        out = torch.matmul(probs, repeat_kv(value, n_rep))
    elif rules is not None:
        out, lse = rules_attention(query, key, value, rules, scaling, sinks, want_lse, key_bias, edit)
    else:
        refuse_padded_edit(None, edit, mask)
        out, lse = fast_attention(
            query, key, value, mask, scaling, sinks, return_lse=want_lse, key_bias=key_bias, edit=edit
        )
    if want_lse:
        site.hook_lse(lse)
    out = _bthd(out)
    if site is not None and site.gated:  # hook_z is the gated output: the adapter's gate hooks fire it
        site.pending_z = out
    elif site is not None:
        out = site.hook_z(out)
    return out.contiguous(), weights


_registered = False


def register() -> str:
    """Register ``"probe"`` with transformers' attention and mask interfaces (idempotent); returns the name."""
    global _registered
    if not _registered:
        AttentionInterface.register(ATTN_IMPLEMENTATION, probe_attention)
        AttentionMaskInterface.register(ATTN_IMPLEMENTATION, rules_mask)
        _registered = True
    return ATTN_IMPLEMENTATION
