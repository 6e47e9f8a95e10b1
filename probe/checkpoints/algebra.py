"""The hook vocabulary's algebra (docs/definitions.md#hook-algebra): the equations that make a hook name mean one thing
on every architecture, checked on a model's own captured tensors.

:func:`check` runs one forward with every hook cached and returns, per rule, the largest |difference| over layers
(``None`` where the rule does not apply to the model, with the reason in ``skipped``). The coverage table runs it in
fp64 on every supported ``model_type``; a type that breaks a rule is "partial" with the rule named. Users can run it on
their own checkpoint: ``probe.checkpoints.algebra.check(model, ids)``.

The rules (l a layer, h a head):

* ``embed``: hook_embed (+ hook_pos_embed) == blocks.0.hook_resid_pre (what the stream starts from)
* ``resid_mid``: resid_pre + attn_out == resid_mid (in a parallel block too, whose mid point is defined so)
* ``resid_post``: resid_mid + mlp_out == resid_post; resid_pre + attn_out + mlp_out == resid_post where a block has
  no mid point (HF's own layer forward)
* ``result``: Σ_h result_h + b_O == the attention's output projection (b_O the same vector at every position)
* ``z``: pattern @ v_out (each query head reading its KV head) [⊙ out_gate] == z, on softmax layers (DeepSeek-V4's
  compressed layers: v_out with hook_compressed_kv's entries after it, as hook_pattern's columns)
* ``scores``: softmax over the real keys and the phantom of attn_scores == pattern (attn_scores carry any key bias:
  ALiBi, a routing gate's log g, FoX's -Σ_{l<=j} log f_l; the model's own rule for one
  whose ``attention_rule`` is in probe.kernels.row_rules: softpick, sigmoid, ...; hook_phantom, where it fires, is
  1 - the row's sum)
* ``rot_q`` / ``rot_k``: rot_q == the layer's rotary applied to q_normed (or q) at positions 0 .. T-1
* ``unembed``: unembed(unembed.hook_in) == the logits, and the final norm of the last resid_post == unembed.hook_in

A hyper-connected model (probe's HC / mHC, DeepSeek-V4's mHC: ``extra["hc_streams"]`` = N streams, resid_pre / mid /
post their sum) mixes its streams around each sub-layer, so resid_pre + attn_out == resid_mid holds only where the
mix keeps the sum and the write weights sum to 1; its rules instead, with hook_streams (B,T,N,d) and each
connection's hc_{attn,mlp}.hook_post / hook_res:

* ``embed``: every stream of blocks.0.hook_streams == hook_embed (every stream starts as the embedding)
* ``resid_mid``: streams_mid == post ⊗ attn_out + res · streams (stream k: Σ_j res[k,j]·stream_j + post_k·attn_out),
  Σ_k streams_k == resid_pre, Σ_k streams_mid_k == resid_mid, and so the summed rule resid_mid == resid_pre +
  (Σ_k post_k)·attn_out + Σ_j (Σ_k res[k,j] − 1)·stream_j (the last term 0 where res's columns sum to 1)
* ``resid_post``: the next block's streams == post ⊗ mlp_out + res · streams_mid (the MLP's connection), summed ==
  resid_post, and resid_post == resid_mid + (Σ_k post_k)·mlp_out + Σ_j (Σ_k res[k,j] − 1)·streams_mid_j
* ``unembed``: its first half only; the final norm reads the streams collapsed by weights of the model's own
  (``hc_head``), not their sum

An AltUp model (Gemma 3n: ``extra["altup_streams"]`` = N, probe.checkpoints.adapters.gemma3n) runs its sub-layers on
one active stream a of N, with altup.hook_predict c (B,T,N,N, out × in), altup.hook_correct e (B,T,N), its LAuReL
branch's hook_laurel_out and the per-layer input's write hook_per_layer_out:

* ``embed``: hook_embed == the active stream of blocks.0.hook_streams
* ``resid_mid``: resid_mid == (resid_pre + attn_out + laurel_out) / √2, and resid_pre == the active prediction
  stream_a + Σ_j c[a,j]·stream_j (of hook_streams)
* ``resid_post``: resid_post == resid_mid + mlp_out; hook_streams_post == prediction_k + e_k·(resid_post −
  resid_pre) (+ per_layer_out on streams 1 .. N−1), prediction_k = stream_k + Σ_j c[k,j]·stream_j; and the next
  block's hook_streams == hook_streams_post
* ``unembed``: its first half (the final norm reads the N streams projected back and averaged)

The LAuReL rule applies wherever a layer fires hook_laurel_out.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import sys

import torch

from probe.hooks import names
from probe.kernels.diff_attention import SIGNED_RULES, net_pattern, patterns_of_scores
from probe.kernels.row_rules import ROW_RULES

RULES = ("embed", "resid_mid", "resid_post", "result", "z", "scores", "rot_q", "rot_k", "unembed")


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0


def _worst(values) -> float | None:
    """The largest difference (NaN when any is NaN: a layer where the rule could not be evaluated), None if none."""
    values = [v for v in values if v is not None]
    if any(v != v for v in values):
        return float("nan")
    return max(values) if values else None


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half rotary of x (B,T,heads,dh) over its first 2·len(cos[0]) coordinates; cos/sin (T, d_rot/2)."""
    half = cos.shape[-1]
    rot, rest = x[..., : 2 * half], x[..., 2 * half :]
    a, b = rot[..., :half], rot[..., half:]
    c, s = cos[None, :, None].to(x.dtype), sin[None, :, None].to(x.dtype)
    return torch.cat([a * c - b * s, b * c + a * s, rest], dim=-1)


def _residual(cache, info, out: dict, skipped: dict) -> None:
    start = cache.get(names.EMBED)
    if start is not None and info.extra.get("altup_streams"):  # AltUp: the active stream starts as the embedding
        out["embed"] = _diff(start, cache[names.streams(0)][:, :, info.extra["altup_active"]])
    elif start is not None:
        position = cache.get(names.pos_embed())
        out["embed"] = _diff(start if position is None else start + position, cache[names.resid(0, "pre")])
    else:
        out["embed"] = None
        skipped["embed"] = "no hook_embed"
    mids, posts = [], []
    if info.extra.get("hc_streams"):  # hyper-connected streams: the stream rules (module docstring)
        _streams(cache, info, out)
        return
    if info.has_depth_sources:  # the stream is a weighted read of the sources, not their sum (docs: depth routing)
        out["resid_mid"] = out["resid_post"] = None
        skipped["resid_mid"] = skipped["resid_post"] = "depth-routed: resid_mid / resid_post are depth reads"
        return
    for l in range(info.n_layers):
        pre, post = cache[names.resid(l, "pre")], cache[names.resid(l, "post")]
        attn_out, mlp_out = cache.get(names.sublayer_out(l, "attn")), cache.get(names.sublayer_out(l, "mlp"))
        mid = cache.get(names.resid(l, "mid"))
        if attn_out is None or mlp_out is None:  # the stream cannot be decomposed there: the rule fails
            skipped.setdefault("resid_post", f"layer {l} has no hook_attn_out or hook_mlp_out")
            posts.append(float("nan"))
            continue
        laurel = cache.get(names.branch_out(l, "laurel"))
        if mid is not None and laurel is not None:  # Gemma 3n: LAuReL's write beside the attention's, then 1/√2
            mids.append(_diff((pre + attn_out + laurel) / math.sqrt(2), mid))
            posts.append(_diff(mid + mlp_out, post))
        elif mid is not None:  # parallel blocks too: their resid_mid is resid_pre + the attention's write
            mids.append(_diff(pre + attn_out, mid))
            posts.append(_diff(mid + mlp_out, post))
        else:
            posts.append(_diff(pre + attn_out + mlp_out, post))
    if info.extra.get("altup_streams"):
        _altup(cache, info, mids, posts)
    out["resid_mid"] = _worst(mids)
    out["resid_post"] = _worst(posts)
    if out["resid_mid"] is None:
        skipped.setdefault("resid_mid", "no layer fires hook_resid_mid in a sequential block")


def _altup(cache, info, mids: list, posts: list) -> None:
    """AltUp's stream rules (module docstring), appended per layer to the ``resid_mid`` / ``resid_post`` lists."""
    active, last = info.extra["altup_active"], info.n_layers - 1
    for l in range(info.n_layers):
        streams, coefs = cache[names.streams(l)].double(), cache[names.altup(l, "predict")].double()  # B,T,N,d; N,N
        predictions = streams + torch.einsum("btkj,btjd->btkd", coefs, streams)  # B,T,N,d
        pre, post = cache[names.resid(l, "pre")].double(), cache[names.resid(l, "post")].double()
        mids.append(_diff(predictions[:, :, active], pre))
        predictions[:, :, active] = pre  # the correction starts from resid_pre (an edit of it included)
        corrected = predictions + cache[names.altup(l, "correct")].double()[..., None] * (post - pre)[:, :, None]
        corrected[:, :, 1:] += cache[names.branch_out(l, "per_layer")].double()[:, :, None]
        handed_on = cache[names.streams(l, "post")]
        posts.append(_diff(corrected, handed_on))
        if l < last:
            posts.append(_diff(handed_on, cache[names.streams(l + 1)]))


def _spread(cache, layer: int, site: str, written: torch.Tensor, streams: torch.Tensor) -> torch.Tensor:
    """post ⊗ written + res · streams (B,T,N,d) from the connection's cached weights (res out × in): the streams after
    the sub-layer ``site`` of ``layer`` wrote ``written`` (B,T,d)."""
    post, res = cache[names.hc(layer, site, "post")].double(), cache[names.hc(layer, site, "res")].double()
    mixed = torch.einsum("btkj,btjd->btkd", res, streams.double())
    return post[..., None] * written.double()[..., None, :] + mixed


def _summed(cache, layer: int, site: str, resid: torch.Tensor, written: torch.Tensor, streams: torch.Tensor):
    """The vocabulary's residual rule with the streams' sum in place of the single residual (B,T,d): resid +
    (Σ_k post_k)·written + Σ_j (Σ_k res[k,j] − 1)·stream_j, the sum of ``_spread`` written in terms of ``resid`` (=
    Σ_j stream_j); the last term is the mix's leak, 0 where res's columns sum to 1."""
    post, res = cache[names.hc(layer, site, "post")].double(), cache[names.hc(layer, site, "res")].double()
    leak = torch.einsum("btj,btjd->btd", res.sum(-2) - 1, streams.double())
    return resid.double() + post.sum(-1, keepdim=True) * written.double() + leak


def _streams(cache, info, out: dict) -> None:
    """The rules of a hyper-connected model (module docstring), each the largest |difference| over layers."""
    last = info.n_layers - 1
    first = cache[names.streams(0)]
    out["embed"] = _diff(cache[names.EMBED].double()[:, :, None].expand(first.shape), first)
    mids, posts = [], []
    for l in range(info.n_layers):
        before, mid = cache[names.streams(l)], cache[names.streams(l, "mid")]
        pre, resid_mid = cache[names.resid(l, "pre")], cache[names.resid(l, "mid")]
        attn_out, mlp_out = cache[names.sublayer_out(l, "attn")], cache[names.sublayer_out(l, "mlp")]
        mids += [_diff(_spread(cache, l, "attn", attn_out, before), mid), _diff(before.double().sum(-2), pre)]
        mids += [
            _diff(mid.double().sum(-2), resid_mid),
            _diff(_summed(cache, l, "attn", pre, attn_out, before), resid_mid),
        ]
        after = _spread(cache, l, "mlp", mlp_out, mid)
        posts += [_diff(after.sum(-2), cache[names.resid(l, "post")])]
        posts.append(_diff(_summed(cache, l, "mlp", resid_mid, mlp_out, mid), cache[names.resid(l, "post")]))
        if l < last:
            posts.append(_diff(after, cache[names.streams(l + 1)]))
    out["resid_mid"], out["resid_post"] = _worst(mids), _worst(posts)


def _as_hook_layout(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor | None:
    """x in the hook's B,T,heads,width layout (HF's attention holds q and k as B,heads,T,width), else None."""
    if x.shape == like.shape:
        return x
    if x.dim() == 4 and x.transpose(1, 2).shape == like.shape:
        return x.transpose(1, 2)
    return None


def _rotary_error(model, layer: int, before: torch.Tensor, rotated: torch.Tensor, calls: dict, scale=None) -> float:
    """|rot − rotary(before)|: probe's models rotate by their tables; an HF model by its own modeling file's
    ``apply_rotary_pos_emb``, recorded during the forward (``calls``: layer -> [(input, output)]). The call whose input
    is ``before`` (or its leading rotary coordinates) gives the rotated coordinates; the rest pass unrotated. A layer
    whose rotary never saw ``before`` must leave it as it is."""
    if not calls and not hasattr(model, "hf_model"):
        tables = model.rotary_tables(layer, rotated.shape[1])
        want = before if tables is None else _rotate(before.double(), *(t.double() for t in tables))
        return _diff(want, rotated)
    rotary, norms = calls.get(layer, {}).get("rotary", ()), calls.get(layer, {}).get("norm", ())
    for x, y in rotary:
        width = x.shape[-1]
        x, y = (_as_hook_layout(t, before[..., :width]) for t in (x, y))
        if x is None or y is None or not _same(x, before[..., :width]):
            continue
        if width == before.shape[-1] and not _same(y, rotated):  # a QK-norm after the rotary (Llama 4, HunYuan)
            for a, b in norms:
                a, b = (_as_hook_layout(t, before) for t in (a, b))
                if a is not None and b is not None and _same(a, y):
                    return _diff(b, rotated)
        return max(_diff(y, rotated[..., :width]), _diff(before[..., width:], rotated[..., width:]))
    return _diff(before if scale is None else before * scale, rotated)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Is the recorded tensor ``a`` the hook's ``b``, up to a few roundings of the coarser dtype (at least 1e-6: HF
    builds its rotary tables in fp32 for fp64 weights, and a fused-QKV family's hook_q is its rotated q turned back,
    ~3e-8 off in fp32)? The candidates (q, k, another layer's) differ by far more."""
    eps = max(torch.finfo(a.dtype).eps, torch.finfo(b.dtype).eps)
    return _diff(a, b) <= max(16 * eps, 1e-6) * (1 + float(b.abs().max()))


@contextlib.contextmanager
def _recorded_rotary(model):
    """Record every call of the HF modeling files' rotary functions (``apply_rotary*``) with the layer whose attention
    made it, and of the attention's norm submodules (a QK-norm after the rotary): {layer: {"rotary"|"norm": [(input,
    output)]}} (a call rotating q and k together gives two pairs)."""
    calls: dict[int, list] = {}
    if not hasattr(model, "hf_model"):
        yield calls
        return
    layers = model.decoder_layers(model.hf_model)
    modules = {l: model.attention_module(layer) for l, layer in enumerate(layers)}
    modules = {l: a for l, a in modules.items() if a is not None}
    files = {sys.modules[type(a).__module__] for a in modules.values()}
    # apply_rotary_pos_emb (rotate-half, interleaved), apply_rotary_emb (Llama 4's complex rotation), ...
    originals = {
        (f, name): fn
        for f in files
        for name, fn in vars(f).items()
        if name.startswith("apply_rotary") and callable(fn) and not inspect.isclass(fn)  # a kernel-hub wrapper too
    }
    current: list[int] = []

    def wrap(fn):
        def recording(*args, **kwargs):
            out = fn(*args, **kwargs)
            if current:
                tensors = [a for a in args if isinstance(a, torch.Tensor)]
                outs = out if isinstance(out, tuple) else (out,)
                calls.setdefault(current[-1], {}).setdefault("rotary", []).extend(zip(tensors[: len(outs)], outs))
            return out

        return recording

    handles = []

    def leave(*_):  # returns None: the attention's output stays as it is
        current.pop()

    def record_norm(_module, inputs, output, l):
        if inputs and isinstance(inputs[0], torch.Tensor) and isinstance(output, torch.Tensor):
            calls.setdefault(l, {}).setdefault("norm", []).append((inputs[0], output))

    for l, attn in modules.items():
        handles.append(attn.register_forward_pre_hook(lambda *_, l=l: current.append(l)))
        handles.append(attn.register_forward_hook(leave))
        for name, sub in attn.named_children():
            if "norm" in name:
                handles.append(sub.register_forward_hook(lambda m, i, o, l=l: record_norm(m, i, o, l)))
    for (f, name), fn in originals.items():
        setattr(f, name, wrap(fn))
    try:
        yield calls
    finally:
        for (f, name), fn in originals.items():
            setattr(f, name, fn)
        for h in handles:
            h.remove()


def _attention(cache, info, out: dict, skipped: dict, projections: dict, model, rotary_calls: dict) -> None:
    results, zs, scores, rots = [], [], [], {"q": [], "k": []}
    G = info.kv_group
    for l in info.attention_layers:
        pattern, v, z = (cache.get(names.attn(l, p)) for p in ("pattern", "v_out", "z"))
        entries = cache.get(names.attn(l, "compressed_kv"))  # B,C,Hkv,dh: keys and values after the T tokens'
        if v is not None and entries is not None:
            v = torch.cat([v, entries.to(v.dtype)], dim=1)
        if pattern is not None and v is not None and z is not None:  # B,H,T,T+C; B,T+C,Hkv,dv; B,T,H,dv
            mixed = torch.einsum("bhqk,bkhd->bqhd", pattern.double(), v.double().repeat_interleave(G, dim=2))
            diff = getattr(model.get_submodule(names.attn_module(l)), "diff", None)
            if diff is not None:  # differential attention: its sub-layer norm and (1 - λ_init) scale on each head
                mixed = diff.finish(mixed.to(z.dtype)).double()
            gate = cache.get(names.attn(l, "out_gate"))
            if gate is not None:
                mixed = mixed * (gate.double() if gate.dim() == 4 else gate.double()[..., None])
            zs.append(_diff(mixed, z))
        raw = cache.get(names.attn(l, "attn_scores"))
        if raw is not None and pattern is not None:
            phantom = cache.get(names.attn(l, "phantom"))
            sink = cache.get(names.attn(l, "sink_logit"))
            logits = raw.double()
            rule = ROW_RULES.get(info.attention_rule)
            if info.attention_rule in SIGNED_RULES:  # both branches' scores (B,2H,T,T): softmax each, p1 - λ p2
                p1, p2 = patterns_of_scores(logits)
                branches = [cache.get(names.attn(l, p)) for p in ("pattern_1", "pattern_2")]
                scores += [_diff(mine, theirs) for mine, theirs in zip((p1, p2), branches) if theirs is not None]
                probs = net_pattern(p1, p2, cache[names.attn(l, "lambda")].double())
            elif rule is not None:  # rows may leave mass unspent (or sum past one): the phantom is what they leave
                probs = rule.of_scores(logits, bias=rule.bias(info.n_ctx))
                if phantom is not None:
                    scores.append(_diff(phantom.double(), 1.0 - pattern.double().sum(-1)))
                phantom = None  # checked here, not as a phantom-less softmax's zeros below
            elif sink is not None:  # the phantom key's logit joins each row
                col = sink.double()[None, :, None, None].expand(*logits.shape[:3], 1)
                probs = torch.softmax(torch.cat([logits, col], -1), -1)[..., :-1]
            else:
                probs = torch.softmax(logits, -1)
            scores.append(_diff(probs, pattern))
            if phantom is not None and sink is None:
                scores.append(_diff(phantom, torch.zeros_like(phantom)))
        result, written = cache.get(names.attn(l, "result")), projections.get(l)
        if result is not None and written is not None:  # B,T,H,d and B,T,d
            bias = written.double() - result.double().sum(2)
            results.append(_diff(bias, bias[:1, :1].expand_as(bias)))
        for which in ("q", "k"):
            rotated = cache.get(names.rot(l, which))
            before = cache.get(names.attn(l, f"{which}_normed"))
            before = cache.get(names.attn(l, which)) if before is None else before
            if rotated is not None and before is not None:
                scale = info.extra.get("query_scale") if which == "q" else None  # OPT's query scaling
                rots[which].append(_rotary_error(model, l, before, rotated, rotary_calls, scale))
    out["z"], out["scores"], out["result"] = _worst(zs), _worst(scores), _worst(results)
    out["rot_q"], out["rot_k"] = _worst(rots["q"]), _worst(rots["k"])
    for rule, why in (
        ("z", "no softmax layer with hook_pattern, hook_v_out and hook_z"),
        ("scores", "no hook_attn_scores"),
        ("result", "no hook_result, or the attention's output projection was not seen"),
        ("rot_q", "no hook_rot_q beside hook_q"),
        ("rot_k", "no hook_rot_k beside hook_k"),
    ):
        if out[rule] is None:
            skipped[rule] = why


def _unembed(cache, model, logits, out: dict, skipped: dict) -> None:
    hidden = cache.get(names.unembed_in())
    if hidden is None or not hasattr(model, "unembed"):
        skipped["unembed"] = f"no {names.unembed_in()}"
        out["unembed"] = None
        return
    errors = [_diff(model.unembed(hidden), logits)]
    last = cache[names.resid(model.probe_info.n_layers - 1, "post")]
    final_norm = model.norm_module(None) if hasattr(model, "norm_module") else None
    if {"hc_streams", "altup_streams"} & set(model.probe_info.extra):  # the final norm reads the streams collapsed
        final_norm = None
    if final_norm is not None:
        if last.shape[1] == hidden.shape[1] + 1:  # a sink token: the unembedding reads the text positions only
            last = last[:, 1:]
        errors.append(_diff(final_norm(last), hidden))
    out["unembed"] = max(errors)


def _output_projections(model) -> tuple[dict, list]:
    """Forward hooks recording what each softmax layer's attention module writes through its output projection (the
    module's output: HF attention modules return it first; probe's Attention too), keyed by layer."""
    seen, handles = {}, []
    attention_module = getattr(model, "attention_module", None)
    if attention_module is not None and hasattr(model, "decoder_layers"):
        modules = [attention_module(layer) for layer in model.decoder_layers(model.hf_model)]
    elif hasattr(model, "blocks"):
        modules = [getattr(b, "attn", None) for b in model.blocks]
    else:
        modules = []
    for l, module in enumerate(modules):
        if module is None:
            continue

        def record(_m, _inputs, output, l=l):
            seen[l] = (output[0] if isinstance(output, tuple) else output).detach()

        handles.append(module.register_forward_hook(record))
    return seen, handles


def check(model, ids: torch.Tensor) -> tuple[dict, dict]:
    """Run ``model`` on ``ids`` (B,T) with every hook cached: ({rule: largest |difference| or None}, {rule: why it
    was not checked}). Compare in the model's dtype's precision (fp64: ~1e-12)."""
    projections, handles = _output_projections(model)
    try:
        with torch.no_grad(), _recorded_rotary(model) as rotary_calls:
            logits, cache = model.run_with_cache(ids)
    finally:
        for h in handles:
            h.remove()
    cache = dict(cache)
    info = model.probe_info
    out, skipped = {}, {}
    with torch.no_grad():  # the final norm and the unembedding run again on cached tensors
        _residual(cache, info, out, skipped)
        _attention(cache, info, out, skipped, projections, model, rotary_calls)
        _unembed(cache, model, logits, out, skipped)
    return out, skipped


def failures(errors: dict, tolerance: float) -> list[str]:
    """The rules whose largest difference exceeds ``tolerance`` (or is NaN), as 'rule (difference)'."""
    bad = []
    for rule in RULES:
        d = errors.get(rule)
        if d is not None and not d <= tolerance:
            bad.append(f"{rule} ({d:.2g})")
    return bad
