"""HF adapters (GPT-NeoX, gpt-oss, llama): §3 hooks on HF checkpoints, exact against HF eager attention."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM

import probe
from probe.checkpoints import attention as A
from probe.checkpoints.tiny import build_tiny
from probe.hooks import names
from tests.support.adapters import check_logits_match_hf_eager

FAMILIES = ("gpt_neox", "gpt_oss", "llama")
ATOL = 1e-5  # logits, fast (SDPA) path vs HF eager, fp32; measured max |Δ| ≈ 1e-7
EXACT = 1e-6  # pattern path vs HF eager: same fp32 ops


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_hf")
    return {fam: build_tiny(fam, root / fam) for fam in FAMILIES}


@pytest.fixture(scope="module")
def models(dirs):
    """family -> (adapted model via probe.load, reference HF model with eager attention)."""
    out = {}
    for fam, d in dirs.items():
        ref = AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager", dtype=torch.float32).eval()
        out[fam] = (probe.load(str(d)), ref)
    return out


def ids(B=2, T=12, seed=0):
    return torch.randint(2, 96, (B, T), generator=torch.Generator().manual_seed(seed))


def hf_attn_modules(ref):
    if ref.config.model_type == "gpt_neox":
        return [layer.attention for layer in ref.gpt_neox.layers]
    return [layer.self_attn for layer in ref.model.layers]


@pytest.mark.parametrize("fam", FAMILIES)
@torch.no_grad()
def test_logits_match_hf_eager(models, fam):
    m, ref = models[fam]
    cache = check_logits_match_hf_eager(m, ref, ids(), ATOL, EXACT)
    assert set(cache) >= {"hook_embed", "blocks.1.hook_resid_post", "blocks.0.attn.hook_pattern"}


@pytest.mark.parametrize("fam", FAMILIES)
@torch.no_grad()
def test_hook_shapes(models, fam):
    m, _ = models[fam]
    info = m.probe_info
    B, T, H, Hkv, dh, d = 2, 12, info.n_heads, info.n_kv_heads, info.d_head, info.d_model
    _, cache = m.run_with_cache(ids(B, T))
    shapes = {"hook_embed": (B, T, d)}
    for l in range(info.n_layers):
        shapes.update(
            {
                f"blocks.{l}.hook_resid_pre": (B, T, d),
                f"blocks.{l}.hook_resid_mid": (B, T, d),
                f"blocks.{l}.hook_resid_post": (B, T, d),
                f"blocks.{l}.hook_attn_out": (B, T, d),
                f"blocks.{l}.hook_mlp_out": (B, T, d),
                f"blocks.{l}.attn.hook_q": (B, T, H, dh),
                f"blocks.{l}.attn.hook_k": (B, T, Hkv, dh),
                f"blocks.{l}.attn.hook_rot_q": (B, T, H, dh),
                f"blocks.{l}.attn.hook_rot_k": (B, T, Hkv, dh),
                f"blocks.{l}.attn.hook_attn_scores": (B, H, T, T),
                f"blocks.{l}.attn.hook_result": (B, T, H, d),
                f"blocks.{l}.attn.hook_v": (B, T, Hkv, dh),
                f"blocks.{l}.attn.hook_v_out": (B, T, Hkv, dh),
                f"blocks.{l}.attn.hook_pattern": (B, H, T, T),
                f"blocks.{l}.attn.hook_pattern_norm": (B, H, T, T),
                f"blocks.{l}.attn.hook_phantom": (B, H, T),
                f"blocks.{l}.attn.hook_lse": (B, H, T),
                f"blocks.{l}.attn.hook_z": (B, T, H, dh),
            }
        )
        if info.has_phantom:
            shapes[f"blocks.{l}.attn.hook_sink_logit"] = (H,)
        shapes.update(norm_and_mlp_shapes(m, l, B, T))
    shapes.update({names.norm(None, point="scale"): (B, T, 1), names.norm(None, point="normalized"): (B, T, d)})
    shapes[names.unembed_in()] = (B, T, d)
    assert {k: tuple(v.shape) for k, v in cache.items()} == shapes


def norm_and_mlp_shapes(m, layer: int, B: int, T: int) -> dict:
    """Block ``layer``'s norm points (ln1, ln2) and MLP points: gated (llama), plain (GPT-NeoX), routed (gpt-oss)."""
    config, d = m.hf_model.config, m.probe_info.d_model
    shapes = {names.norm(layer, w, "scale"): (B, T, 1) for w in ("ln1", "ln2")}
    shapes.update({names.norm(layer, w, "normalized"): (B, T, d) for w in ("ln1", "ln2")})
    if m.family == "gpt_oss":
        E, k = config.num_local_experts, config.num_experts_per_tok
        routed = {"router_logits": (B, T, E), "expert_indices": (B, T, k), "expert_weights": (B, T, E)}
        return shapes | {names.mlp(layer, p): shape for p, shape in routed.items()}
    points = ("pre", "pre_linear", "post") if m.family == "llama" else ("pre", "post")
    return shapes | {names.mlp(layer, p): (B, T, config.intermediate_size) for p in points}


@torch.no_grad()
def test_model_info_per_family(models):
    neox, oss, llama = (models[f][0].probe_info for f in FAMILIES)
    assert (neox.family, neox.n_heads, neox.n_kv_heads, neox.d_head, neox.has_phantom) == ("gpt_neox", 4, 4, 8, False)
    assert neox.extra["rotary_dims"] == 2 and neox.extra["parallel_residual"] is True
    assert (oss.family, oss.n_kv_heads, oss.kv_group, oss.has_phantom) == ("gpt_oss", 2, 2, True)
    assert oss.layer_types == ["sliding", "full"] and oss.sliding_window == 4
    assert (llama.family, llama.n_kv_heads, llama.layer_types, llama.sliding_window) == ("llama", 2, ["full"] * 2, None)


def _capture_hf_qkv(ref, x):
    """What HF computes inside each attention: q, k after rotary, v, and q, k before rotary, as (B,T,heads,dh),
    captured independently of the adapter (projection outputs + the model's own rotary function)."""
    import importlib

    mt = ref.config.model_type
    mod = importlib.import_module(f"transformers.models.{mt}.modeling_{mt}")
    proj = {}
    handles = []
    attns = hf_attn_modules(ref)
    for l, a in enumerate(attns):
        if mt == "gpt_neox":
            handles.append(
                a.query_key_value.register_forward_hook(lambda _m, _i, o, l=l: proj.__setitem__((l, "qkv"), o))
            )
        else:
            for p in ("q", "k", "v"):
                handles.append(
                    getattr(a, f"{p}_proj").register_forward_hook(
                        lambda _m, _i, o, l=l, p=p: proj.__setitem__((l, p), o)
                    )
                )
    ref(x)
    for h in handles:
        h.remove()
    B, T = x.shape
    base = ref.gpt_neox if mt == "gpt_neox" else ref.model
    cos, sin = base.rotary_emb(base.get_input_embeddings()(x), torch.arange(T)[None])
    out = []
    for l, a in enumerate(attns):
        if mt == "gpt_neox":
            H = ref.config.num_attention_heads
            qkv = proj[(l, "qkv")].view(B, T, H, -1)  # q|k|v interleaved per head
            dh = qkv.shape[-1] // 3
            q, k, v = qkv[..., :dh], qkv[..., dh : 2 * dh], qkv[..., 2 * dh :]
        else:
            dh = a.head_dim
            q, k, v = (proj[(l, p)].view(B, T, -1, dh) for p in "qkv")
        qr, kr = mod.apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
        out.append((qr.transpose(1, 2), kr.transpose(1, 2), v, q, k))
    return out


@pytest.mark.parametrize("fam", FAMILIES)
@torch.no_grad()
def test_qkv_hooks_equal_what_hf_aggregates(models, fam):
    m, ref = models[fam]
    x = ids()
    wanted = {"hook_q", "hook_k", "hook_rot_q", "hook_rot_k", "hook_v"}
    _, cache = m.run_with_cache(x, names_filter=lambda n: n.split(".")[-1] in wanted)
    for l, (q, k, v, q_pre, k_pre) in enumerate(_capture_hf_qkv(ref, x)):
        torch.testing.assert_close(cache[f"blocks.{l}.attn.hook_v"], v, atol=EXACT, rtol=0)
        torch.testing.assert_close(cache[f"blocks.{l}.attn.hook_rot_q"], q, atol=EXACT, rtol=0)
        torch.testing.assert_close(cache[f"blocks.{l}.attn.hook_rot_k"], k, atol=EXACT, rtol=0)
        # before rotary: q_proj's output, or (GPT-NeoX's fused projection) hook_rot_q turned back by the rotary tables
        torch.testing.assert_close(cache[f"blocks.{l}.attn.hook_q"], q_pre, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(cache[f"blocks.{l}.attn.hook_k"], k_pre, atol=1e-5, rtol=1e-5)
    if fam == "gpt_neox":  # rotary touched only the first 25% of each head's dims
        q_pre = _capture_hf_qkv(ref, x)[0][3]
        assert torch.equal(cache["blocks.0.attn.hook_rot_q"][..., 2:], q_pre[..., 2:])


@pytest.mark.parametrize("fam", FAMILIES)
@torch.no_grad()
def test_pattern_and_phantom_match_hf_eager(models, fam):
    m, ref = models[fam]
    x = ids()
    hf = ref(x, output_attentions=True).attentions
    _, cache = m.run_with_cache(x, names_filter=lambda n: n.endswith(("hook_pattern", "hook_phantom")))
    for l, w in enumerate(hf):
        pat, ph = cache[f"blocks.{l}.attn.hook_pattern"], cache[f"blocks.{l}.attn.hook_phantom"]
        torch.testing.assert_close(pat, w, atol=EXACT, rtol=0)
        torch.testing.assert_close(ph, 1 - w.sum(-1), atol=EXACT, rtol=0)
        if fam == "gpt_oss":
            assert ph.min() > 1e-4  # sinks randn*3: the phantom carries real mass
        else:
            assert torch.equal(ph, torch.zeros_like(ph))


@torch.no_grad()
def test_gpt_oss_phantom_is_exp_sink_minus_lse_per_layer_type(models):
    """phantom = exp(sink − lse), lse over the real keys the layer may see and the sink, computed here from
    hook_rot_q, hook_rot_k and a mask built from the config (sliding window for sliding layers), independently of HF
    and the adapter's softmax."""
    m, ref = models["gpt_oss"]
    x = ids(T=12)
    T, W = x.shape[1], ref.config.sliding_window
    _, cache = m.run_with_cache(x)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None]
    seen_types = set()
    for l, layer in enumerate(ref.model.layers):
        kind = ref.config.layer_types[l]
        seen_types.add(kind)
        allowed = (j <= i) & ((i - j < W) if kind == "sliding_attention" else True)
        q = cache[f"blocks.{l}.attn.hook_rot_q"].transpose(1, 2).double()  # B,H,T,dh
        k = cache[f"blocks.{l}.attn.hook_rot_k"].transpose(1, 2).double().repeat_interleave(2, dim=1)
        sink = layer.self_attn.sinks.double()
        torch.testing.assert_close(cache[f"blocks.{l}.attn.hook_sink_logit"], layer.self_attn.sinks, atol=0, rtol=0)
        logits = (q @ k.transpose(-1, -2)) * layer.self_attn.scaling
        logits = logits.masked_fill(~allowed, -math.inf)
        lse = torch.logsumexp(torch.cat([logits, sink.view(1, -1, 1, 1).expand(*logits.shape[:3], 1)], -1), -1)
        phantom = torch.exp(sink.view(1, -1, 1) - lse)
        torch.testing.assert_close(cache[f"blocks.{l}.attn.hook_phantom"].double(), phantom, atol=1e-6, rtol=0)
        pat = cache[f"blocks.{l}.attn.hook_pattern"]
        if kind == "sliding_attention":
            assert torch.all(pat[..., ~allowed] == 0) and torch.all(pat[:, :, W:, 0] == 0)
        torch.testing.assert_close(pat.sum(-1) + cache[f"blocks.{l}.attn.hook_phantom"], torch.ones_like(pat[..., 0]))
    assert seen_types == {"sliding_attention", "full_attention"}


def _scale_v_at(pos, factor):
    def hook(v, hook):
        v = v.clone()
        v[:, pos] *= factor
        return v

    return hook


@pytest.mark.parametrize("fam", FAMILIES)
@pytest.mark.parametrize("with_pattern", [False, True])
@torch.no_grad()
def test_editing_hook_v_equals_editing_inside_hf(models, fam, with_pattern):
    """Scaling position 3's value read in layer 0 == the same edit on HF's value projection output."""
    m, ref = models[fam]
    x, pos, factor = ids(), 3, 2.5
    attn0 = hf_attn_modules(ref)[0]
    if fam == "gpt_neox":

        def edit(_m, _i, out):
            out = out.clone()
            B, T = out.shape[:2]
            view = out.view(B, T, ref.config.num_attention_heads, -1)
            dh = view.shape[-1] // 3
            view[:, pos, :, 2 * dh :] *= factor  # the v slice of every head's interleaved q|k|v
            return out

        h = attn0.query_key_value.register_forward_hook(edit)
    else:

        def edit(_m, _i, out):
            out = out.clone()
            out[:, pos] *= factor
            return out

        h = attn0.v_proj.register_forward_hook(edit)
    try:
        want = ref(x).logits
    finally:
        h.remove()
    hooks = [("blocks.0.attn.hook_v", _scale_v_at(pos, factor))]
    if with_pattern:
        hooks.append(("blocks.0.attn.hook_pattern", lambda p, hook: None))
    got = m.run_with_hooks(x, fwd_hooks=hooks)
    assert (want - ref(x).logits).abs().max() > 1e-3  # the edit matters
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("fam", FAMILIES)
@torch.no_grad()
def test_editing_hook_z_equals_editing_o_proj_input(models, fam):
    m, ref = models[fam]
    x = ids()
    attn1 = hf_attn_modules(ref)[1]
    out_proj = attn1.dense if fam == "gpt_neox" else attn1.o_proj
    dh = m.probe_info.d_head

    def pre(_m, args):
        z = args[0].clone()
        z[..., dh : 2 * dh] = 0  # zero-ablate head 1
        return (z,)

    h = out_proj.register_forward_pre_hook(pre)
    try:
        want = ref(x).logits
    finally:
        h.remove()

    def ablate(z, hook):
        z = z.clone()
        z[:, :, 1] = 0
        return z

    got = m.run_with_hooks(x, fwd_hooks=[("blocks.1.attn.hook_z", ablate)])
    assert (want - ref(x).logits).abs().max() > 1e-4
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("fam", FAMILIES)
@torch.no_grad()
def test_residual_hooks(models, fam):
    m, ref = models[fam]
    x = ids()
    hf = ref(x, output_hidden_states=True).hidden_states
    attn_out = {}
    hs = [
        a.register_forward_hook(lambda _m, _i, o, l=l: attn_out.__setitem__(l, o[0]))
        for l, a in enumerate(hf_attn_modules(ref))
    ]
    ref(x)
    for h in hs:
        h.remove()
    _, cache = m.run_with_cache(x, names_filter=lambda n: "resid" in n or n == "hook_embed")
    torch.testing.assert_close(cache["hook_embed"], hf[0], atol=0, rtol=0)
    L = m.probe_info.n_layers
    for l in range(L):
        pre, mid, post = (cache[f"blocks.{l}.hook_resid_{s}"] for s in ("pre", "mid", "post"))
        torch.testing.assert_close(pre, hf[l], atol=EXACT, rtol=0)
        if l < L - 1:
            torch.testing.assert_close(post, hf[l + 1], atol=EXACT, rtol=0)
        # resid_mid = resid_pre + attention output (NeoX parallel residual included: documented definition)
        torch.testing.assert_close(mid, pre + attn_out[l], atol=EXACT, rtol=0)


@pytest.mark.parametrize("fam", ["gpt_neox", "llama"])
@torch.no_grad()
def test_editing_resid_mid(models, fam):
    """Adding δ to resid_mid == adding δ to the attention output in HF. For NeoX's parallel residual the MLP reads
    LN(resid_pre), so this equivalence is exactly the documented meaning of resid_mid there."""
    m, ref = models[fam]
    x = ids()
    delta = torch.randn(m.probe_info.d_model, generator=torch.Generator().manual_seed(1))
    attn0 = hf_attn_modules(ref)[0]
    h = attn0.register_forward_hook(lambda _m, _i, o: (o[0] + delta,) + tuple(o[1:]))
    try:
        want = ref(x).logits
    finally:
        h.remove()
    got = m.run_with_hooks(x, fwd_hooks=[("blocks.0.hook_resid_mid", lambda r, hook: r + delta)])
    assert (want - ref(x).logits).abs().max() > 1e-3
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


@torch.no_grad()
def test_sink_logit_edit(models):
    """Setting hook_sink_logit to a very negative value removes the phantom, like setting HF's sinks parameter."""
    m, ref = models["gpt_oss"]
    x = ids()
    sinks = ref.model.layers[0].self_attn.sinks
    saved = sinks.clone()
    sinks.fill_(-1e4)
    try:
        want = ref(x).logits
    finally:
        sinks.copy_(saved)
    got, cache = m.run_with_cache(x, names_filter="blocks.0.attn.hook_phantom")
    assert cache["blocks.0.attn.hook_phantom"].min() > 0
    with m.hooks(fwd_hooks=[("blocks.0.attn.hook_sink_logit", lambda s, hook: torch.full_like(s, -1e4))]):
        got, cache = m.run_with_cache(x, names_filter="blocks.0.attn.hook_phantom")
    assert cache["blocks.0.attn.hook_phantom"].max() == 0
    assert (want - ref(x).logits).abs().max() > 1e-3
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("fam", FAMILIES)
@torch.no_grad()
def test_pattern_only_materialised_when_asked(models, fam, monkeypatch):
    m, _ = models[fam]
    x = ids()
    calls = []
    real = A.eager_probs
    monkeypatch.setattr(A, "eager_probs", lambda *a, **k: calls.append(1) or real(*a, **k))
    m(x)
    m.run_with_cache(x, names_filter=lambda n: n.endswith(("hook_v", "hook_z", "resid_post")))
    assert calls == []
    m.run_with_cache(x, names_filter="blocks.1.attn.hook_phantom")
    assert len(calls) == 1  # only the layer that was asked
    m.materialize_patterns = True
    try:
        m(x)
    finally:
        m.materialize_patterns = False
    assert len(calls) == 1 + m.probe_info.n_layers
    # HF's own output_attentions on the adapted model also gets the pattern
    out = m(x, output_attentions=True)
    assert len(out.attentions) == m.probe_info.n_layers and out.attentions[0].shape[-1] == x.shape[1]


@pytest.mark.parametrize("sink_scale", [0.0, 3.0, 10.0])
def test_fast_sink_attention_equals_eager(sink_scale):
    """The one-SDPA-call sink formulation equals the explicit softmax with a sink column (GQA, window, padding)."""
    g = torch.Generator().manual_seed(0)
    B, H, Hkv, T, dh = 2, 4, 2, 9, 8
    q, k, v = (torch.randn(B, h, T, dh, generator=g) for h in (H, Hkv, Hkv))
    sinks = torch.randn(H, generator=g) * sink_scale if sink_scale else None
    i, j = torch.arange(T)[:, None], torch.arange(T)[None]
    allowed = (j <= i) & (i - j < 5)
    allowed = allowed[None, None].repeat(B, 1, 1, 1)
    allowed[1, :, :, :2] = False  # left padding in sequence 1
    allowed[1, :, :2, 0] = True  # keep padded rows non-empty
    mask = torch.zeros(B, 1, T, T).masked_fill(~allowed, torch.finfo(torch.float32).min)
    pattern, phantom, lse = A.eager_probs(q, A.repeat_kv(k, 2), mask, dh**-0.5, sinks)
    want = pattern @ A.repeat_kv(v, 2)
    got, got_lse = A.fast_attention(q, k, v, mask, dh**-0.5, sinks, return_lse=True)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(pattern.sum(-1) + phantom, torch.ones(B, H, T))
    torch.testing.assert_close(got_lse, lse, atol=1e-5, rtol=1e-6)  # over the real keys (padding: eager's min)


@torch.no_grad()
def test_padding_and_batch_consistency(models):
    """Left-padded batch rows give the same last-token logits as the unpadded sequence (mask flows through)."""
    m, _ = models["llama"]
    x = ids(B=1, T=8)
    want = m(x).logits[0, -1]
    padded = torch.cat([torch.ones(1, 3, dtype=torch.long), x], 1)
    mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 8, dtype=torch.long)], 1)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    got = m(padded, attention_mask=mask, position_ids=pos).logits[0, -1]
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    _, cache = m.run_with_cache(
        padded, attention_mask=mask, position_ids=pos, names_filter="blocks.0.attn.hook_pattern"
    )
    assert torch.all(cache["blocks.0.attn.hook_pattern"][0, :, 3:, :3] == 0)


@torch.no_grad()
def test_deepcopy_is_an_independent_hooked_model(models):
    import copy

    m, ref = models["gpt_oss"]
    c = copy.deepcopy(m)
    x = ids()
    seen = []
    m.add_hook("blocks.0.attn.hook_v", lambda t, hook: seen.append("original"))
    try:
        _, cache = c.run_with_cache(x)
    finally:
        m.reset_hooks()
    assert seen == [] and "hook_embed" in cache and "blocks.1.attn.hook_phantom" in cache
    torch.testing.assert_close(
        cache["blocks.1.attn.hook_pattern"], ref(x, output_attentions=True).attentions[1], atol=EXACT, rtol=0
    )
    assert c.hf_model.model.layers[0].self_attn.sinks is not m.hf_model.model.layers[0].self_attn.sinks
