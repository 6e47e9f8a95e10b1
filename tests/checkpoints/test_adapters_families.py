"""Adapters on tiny random configs of the families beyond test_adapters.py: Gemma 2 and 3 (GemmaAdapter: sandwich
norms, sliding/full layers, QK-norm, query_pre_attn_scalar, attention-logit soft-cap) and the llama-family models
LlamaAdapter claims (Qwen2: QKV bias; Qwen3: QK-norm, head width ≠ d_model/heads; Mistral: sliding window).

Every hook is checked against what HF eager computes, captured independently of the adapter: HF's own eager attention
function (q/k/v after QK-norm and rotary, the attention weights), hidden states and module outputs.
"""

from __future__ import annotations

import copy
import importlib

import pytest
import torch
from transformers import AttentionInterface, AutoModelForCausalLM
from transformers.masking_utils import AttentionMaskInterface, eager_mask

import probe
from probe.analyses.capture import row_masses
from probe.checkpoints.adapters import GemmaAdapter, LlamaAdapter, adapt
from probe.checkpoints.tiny import build_tiny, more_tiny_config
from tests.support.adapters import check_logits_match_hf_eager

FAMILIES = ("gemma2", "gemma3_text", "gemma3", "qwen2", "qwen3", "mistral")
GEMMA = ("gemma2", "gemma3_text", "gemma3")
ATOL = 1e-5  # logits, fast (SDPA) path vs HF eager, fp32
# pattern path vs HF eager: the same fp32 ops, but hook views change matmul strides, so rounding differs by a few ulp
# that grow over layers (measured ≤ 2.3e-6); a misplaced norm or a missing cap is off by > 1e-2
EXACT = 1e-5
T = 12  # longer than the tiny sliding window (4), so sliding layers really cut keys


def tiny_gemma3_multimodal():
    """Gemma3ForConditionalGeneration (model_type gemma3) around the tiny gemma3_text config; text inputs only."""
    from transformers import Gemma3Config

    vision = dict(
        model_type="siglip_vision_model",
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=8,
        patch_size=4,
    )
    config = Gemma3Config(
        text_config=more_tiny_config("gemma3_text").to_dict(),
        vision_config=vision,
        mm_tokens_per_image=4,
        boi_token_index=93,
        eoi_token_index=94,
        image_token_index=95,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "language_model" in name and "norm" in name:
                p.add_(torch.randn_like(p) * 0.3)
    return model


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """family -> (adapted model, reference HF model with eager attention)."""
    root = tmp_path_factory.mktemp("tiny_families")
    out = {}
    for fam in FAMILIES:
        if fam == "gemma3":
            ref = tiny_gemma3_multimodal()
            out[fam] = (adapt(copy.deepcopy(ref)), ref)
            continue
        d = build_tiny(fam, root / fam)
        ref = AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager", dtype=torch.float32).eval()
        out[fam] = (probe.load(str(d)), ref)
    return out


def ids(B=2, seed=0):
    return torch.randint(2, 90, (B, T), generator=torch.Generator().manual_seed(seed))


def hf_layers(ref):
    base = ref.model
    return list(getattr(base, "language_model", base).layers)


def text_config(ref):
    return ref.config.get_text_config()


def hf_eager_capture(ref, x):
    """What HF's own eager attention function receives in each layer: q, k (after QK-norm and rotary) and v as
    (B,T,heads,dh), with the weights it returns. The adapter plays no part: the reference model runs its module's
    ``eager_attention_forward`` through a recording attention implementation."""
    seen = []

    def record(module, query, key, value, attention_mask, **kw):
        eager = importlib.import_module(type(module).__module__).eager_attention_forward
        out, weights = eager(module, query, key, value, attention_mask, **kw)
        seen.append(tuple(t.transpose(1, 2) for t in (query, key, value)) + (weights,))
        return out, weights

    AttentionInterface.register("probe_test_record", record)
    AttentionMaskInterface.register("probe_test_record", eager_mask)
    ref.set_attn_implementation("probe_test_record")
    try:
        logits = ref(x).logits
    finally:
        ref.set_attn_implementation("eager")
    return logits, seen


@pytest.mark.parametrize("fam", FAMILIES)
@torch.no_grad()
def test_adapter_per_family(models, fam):
    m, _ = models[fam]
    assert isinstance(m, GemmaAdapter if fam in GEMMA else LlamaAdapter)


@pytest.mark.parametrize("fam", FAMILIES)
@torch.no_grad()
def test_logits_match_hf_eager(models, fam):
    m, ref = models[fam]
    cache = check_logits_match_hf_eager(m, ref, ids(), ATOL, EXACT)
    last = m.probe_info.n_layers - 1
    assert {"hook_embed", "blocks.0.attn.hook_pattern", f"blocks.{last}.hook_resid_post"} <= set(cache)


@pytest.mark.parametrize("fam", FAMILIES)
@torch.no_grad()
def test_qkv_and_pattern_equal_what_hf_eager_computes(models, fam):
    """hook_rot_q/hook_rot_k (after QK-norm and rotary), hook_v, and hook_pattern (soft-cap included) in sliding and
    full layers equal what HF's eager attention receives and returns."""
    m, ref = models[fam]
    x = ids()
    _, seen = hf_eager_capture(ref, x)
    _, cache = m.run_with_cache(x)
    types = []
    for l, (q, k, v, w) in enumerate(seen):
        for name, want in (("rot_q", q), ("rot_k", k), ("v", v), ("pattern", w)):
            torch.testing.assert_close(cache[f"blocks.{l}.attn.hook_{name}"], want, atol=EXACT, rtol=0)
        assert torch.equal(cache[f"blocks.{l}.attn.hook_phantom"], torch.zeros_like(w[..., 0]))
        pattern = cache[f"blocks.{l}.attn.hook_pattern"]
        torch.testing.assert_close(pattern.sum(-1), torch.ones_like(pattern[..., 0]))
        types.append(m.probe_info.layer_types[l])
        if types[-1] == "sliding":  # the window really cuts: rows past it give key 0 nothing
            W = m.probe_info.sliding_window
            i, j = torch.arange(T)[:, None], torch.arange(T)[None]
            assert torch.all(pattern[..., (i - j >= W) | (j > i)] == 0) and pattern[..., W - 1, 0].min() > 0
    want_types = {
        "gemma2": {"sliding", "full"},
        "gemma3_text": {"sliding", "full"},
        "gemma3": {"sliding", "full"},
        "qwen2": {"full"},
        "qwen3": {"full"},
        "mistral": {"sliding"},
    }[fam]
    assert set(types) == want_types


@torch.no_grad()
def test_gemma2_softcap_is_inside_hook_pattern(models):
    """pattern = softmax(cap·tanh(q·k·s / cap) + mask), computed here from hook_rot_q/hook_rot_k, differs clearly from
    the uncapped softmax (the tiny config's cap 2.0 bites), and an edit of hook_pattern reaches hook_z and the
    logits."""
    m, ref = models["gemma2"]
    x = ids()
    info, cfg = m.probe_info, ref.config
    assert info.extra["attn_logit_softcap"] == cfg.attn_logit_softcapping == 2.0
    _, cache = m.run_with_cache(x)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None]
    for l, kind in enumerate(info.layer_types):
        q = cache[f"blocks.{l}.attn.hook_rot_q"].transpose(1, 2).double()
        k = cache[f"blocks.{l}.attn.hook_rot_k"].transpose(1, 2).double().repeat_interleave(info.kv_group, dim=1)
        allowed = (j <= i) & ((i - j < info.sliding_window) if kind == "sliding" else True)
        raw = (q @ k.transpose(-1, -2)) * info.extra["attn_scale"]
        capped = cfg.attn_logit_softcapping * torch.tanh(raw / cfg.attn_logit_softcapping)
        want = torch.softmax(capped.masked_fill(~allowed, float("-inf")), -1)
        uncapped = torch.softmax(raw.masked_fill(~allowed, float("-inf")), -1)
        got = cache[f"blocks.{l}.attn.hook_pattern"].double()
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
        assert (got - uncapped).abs().max() > 0.05

    def drop_key0(p, hook):
        p = p.clone()
        p[..., 0] = 0
        return p

    base = m(x).logits
    with m.hooks(fwd_hooks=[("blocks.1.attn.hook_pattern", drop_key0)]):
        got, edited = m.run_with_cache(x, names_filter=lambda n: n.startswith("blocks.1.attn."))
    v = edited["blocks.1.attn.hook_v"].transpose(1, 2).repeat_interleave(info.kv_group, dim=1)
    z = (edited["blocks.1.attn.hook_pattern"] @ v).transpose(1, 2)
    assert torch.all(edited["blocks.1.attn.hook_pattern"][..., 0] == 0)
    torch.testing.assert_close(edited["blocks.1.attn.hook_z"], z, atol=1e-6, rtol=0)
    assert (got - base).abs().max() > 1e-3


@pytest.mark.parametrize("fam", FAMILIES)
@torch.no_grad()
def test_residual_hooks_follow_hf_norm_order(models, fam):
    """resid_pre/post are HF's hidden states; resid_mid = resid_pre + the attention write, which for Gemma's sandwich
    norms is post_attention_layernorm(attention output)."""
    m, ref = models[fam]
    x = ids()
    writes = {}
    layers = hf_layers(ref)
    src = [(layer.post_attention_layernorm if fam in GEMMA else layer.self_attn) for layer in layers]
    hs = [
        mod.register_forward_hook(lambda _m, _i, o, l=l: writes.__setitem__(l, o[0] if isinstance(o, tuple) else o))
        for l, mod in enumerate(src)
    ]
    try:
        hidden = ref(x, output_hidden_states=True).hidden_states
    finally:
        for h in hs:
            h.remove()
    _, cache = m.run_with_cache(x, names_filter=lambda n: "resid" in n or n == "hook_embed")
    torch.testing.assert_close(cache["hook_embed"], hidden[0], atol=0, rtol=0)  # Gemma: already scaled by √d
    L = len(layers)
    for l in range(L):
        pre, mid, post = (cache[f"blocks.{l}.hook_resid_{s}"] for s in ("pre", "mid", "post"))
        torch.testing.assert_close(pre, hidden[l], atol=EXACT, rtol=0)
        torch.testing.assert_close(mid, pre + writes[l], atol=EXACT, rtol=0)
        if l < L - 1:  # HF's last hidden state is after the final norm
            torch.testing.assert_close(post, hidden[l + 1], atol=EXACT, rtol=0)


@pytest.mark.parametrize("fam", FAMILIES)
@pytest.mark.parametrize("site", ["v", "resid_mid", "z"])
@torch.no_grad()
def test_edits_propagate_like_edits_inside_hf(models, fam, site):
    """An edit through run_with_hooks equals the same edit made inside the HF model: scaling position 3's value read
    (v_proj), adding δ to the attention write (post_attention_layernorm for Gemma), zeroing head 1 before o_proj."""
    m, ref = models[fam]
    x, info = ids(), m.probe_info
    layer = hf_layers(ref)[0 if site != "z" else 1]
    delta = torch.randn(info.d_model, generator=torch.Generator().manual_seed(1))
    dh = info.d_head

    def scale_v(_m, _i, out):
        out = out.clone()
        out[:, 3] *= 2.5
        return out

    def zero_head1(_m, args):
        z = args[0].clone()
        z[..., dh : 2 * dh] = 0
        return (z,)

    if site == "v":
        handle = layer.self_attn.v_proj.register_forward_hook(scale_v)
        hook = ("blocks.0.attn.hook_v", lambda v, hook: torch.cat([v[:, :3], v[:, 3:4] * 2.5, v[:, 4:]], 1))
    elif site == "resid_mid":
        write = layer.post_attention_layernorm if fam in GEMMA else layer.self_attn
        handle = write.register_forward_hook(
            lambda _m, _i, o: (o[0] + delta,) + tuple(o[1:]) if isinstance(o, tuple) else o + delta
        )
        hook = ("blocks.0.hook_resid_mid", lambda r, hook: r + delta)
    else:
        handle = layer.self_attn.o_proj.register_forward_pre_hook(zero_head1)
        hook = ("blocks.1.attn.hook_z", lambda z, hook: torch.cat([z[:, :, :1], 0 * z[:, :, 1:2], z[:, :, 2:]], 2))
    try:
        want = ref(x).logits
    finally:
        handle.remove()
    got = m.run_with_hooks(x, fwd_hooks=[hook])
    assert (want - ref(x).logits).abs().max() > 1e-4  # the edit matters
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


@torch.no_grad()
def test_model_info(models):
    g2, g3, g3m, qwen2, qwen3, mistral = (models[f][0].probe_info for f in FAMILIES)
    assert (g3.family, g3.n_heads, g3.n_kv_heads, g3.d_head) == ("gemma", 4, 1, 16)
    assert g3.layer_types == ["sliding", "sliding", "full"] and g3.sliding_window == 4
    assert g3.extra["attn_scale"] == 8**-0.5 and g3.extra["qk_norm"] and g3.extra["attn_logit_softcap"] is None
    assert g3m.layer_types == g3.layer_types and g3m.extra["model_type"] == "gemma3" and g3m.n_layers == 3
    assert g2.layer_types == ["sliding", "full"] and g2.extra["final_logit_softcap"] == 5.0
    assert not g2.extra["qk_norm"] and not g2.has_phantom
    assert (qwen2.family, qwen2.layer_types, qwen2.sliding_window) == ("llama", ["full"] * 2, None)
    assert (qwen3.d_head, qwen3.d_model, qwen3.n_heads) == (16, 32, 4)  # head width ≠ d_model / heads
    assert (mistral.layer_types, mistral.sliding_window) == (["sliding"] * 2, 4)


@pytest.mark.parametrize("fam", ["gemma3_text", "qwen3", "mistral"])
@torch.no_grad()
def test_streaming_row_masses_read_the_same_attention(models, fam):
    """The analyses' streaming pass (no T×T pattern) rebuilds position-0 mass from hook_rot_q/hook_rot_k with the
    ModelInfo's scale and window: it must equal hook_pattern's key-0 column (Gemma's query_pre_attn_scalar ≠ d_head
    here)."""
    m, _ = models[fam]
    info = m.probe_info
    x = ids()
    _, cache = m.run_with_cache(x)
    indicators = torch.zeros(x.shape[0], T, info.n_kv_heads, 1)
    indicators[:, 0] = 1
    for l in range(info.n_layers):
        got = {n: cache[f"blocks.{l}.attn.{n}"] for n in ("hook_rot_q", "hook_rot_k", "hook_v")}
        _, mass, _ = row_masses(info, l, got, indicators, backend="reference")
        torch.testing.assert_close(mass[..., 0], cache[f"blocks.{l}.attn.hook_pattern"][..., 0], atol=1e-5, rtol=0)
