"""TransformerLens's attention vocabulary with one meaning on probe's models and on HF checkpoints
(docs/definitions.md#hook-namespace), in fp64:

* hook_q / hook_k: the projection's output; an edit of hook_q equals the same edit made on the model's own projection;
* hook_q_normed / hook_k_normed: QK-norm's output, only where there is a QK-norm;
* hook_rot_q / hook_rot_k: the model's own rotary (transformers' apply_rotary_pos_emb) applied to q_normed (or q);
* hook_attn_scores: softmax over them and the phantom is hook_pattern; an edit reaches the output;
* hook_pattern @ v per head is hook_z; Σ_h hook_result + b_O is the attention module's output, and an edit of
  hook_result reaches the output;
* with every hook on, the logits are HF eager's; with none, no score or result is computed (the fused path).
"""

from __future__ import annotations

import copy
import importlib
import inspect

import pytest
import torch

from probe.checkpoints import attention as hf_attention
from probe.checkpoints.adapters import adapt
from probe.checkpoints.tiny import tiny_model
from probe.hooks import names
from probe.models import attention as probe_attention
from probe.models import create
from tests.support.parity import fp64_throughout

B, T = 2, 10
EXACT = 1e-10
HF_TYPES = ("llama", "qwen3", "gemma3_text", "olmo2", "gpt2", "gpt_neox", "phi3")
QK_NORMED = {"qwen3", "gemma3_text", "olmo2"}
PROBE_MODELS = {  # baseline; a phantom key with QK-norm; a routing-slot gate's key bias inside the scores
    "baseline": dict(variant="baseline"),
    "sinklogit+qk_norm": dict(variant="sinklogit", qk_norm=True),
    "routing-normgate": dict(variant="routing-normgate"),
}
EDITED_HEAD = 1


def ids(vocab: int = 90) -> torch.Tensor:
    return torch.randint(2, vocab, (B, T), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module", params=HF_TYPES)
def hf(request):
    """(model_type, HF eager reference, adapter on a copy) in fp64."""
    ref = tiny_model(request.param, dtype=torch.float64).eval()
    return request.param, ref, adapt(copy.deepcopy(ref))


@pytest.fixture(scope="module", params=list(PROBE_MODELS))
def own(request):
    spec = dict(PROBE_MODELS[request.param])
    model = create(spec.pop("variant"), tier="tiny", seed=0, **spec).double().eval()
    if model.config.abstention == "sinklogit":  # a phantom that takes visible mass
        with torch.no_grad():
            for block in model.blocks:
                block.attn.sink.copy_(torch.linspace(-1.0, 2.0, model.config.n_heads))
    return request.param, model


def attention_modules(m) -> list:
    """The attention module of each softmax layer (HF's, or probe's Attention)."""
    if hasattr(m, "hf_model"):
        layers = m.decoder_layers(m.hf_model)
        return [m.attention_module(layers[l]) for l in m.probe_info.attention_layers]
    return [b.attn for b in m.blocks]


def cached_with_module_outputs(m, x):
    """(logits, cache of every hook, each attention module's output B,T,d) of one forward."""
    seen, handles = {}, []
    for l, module in enumerate(attention_modules(m)):
        handles.append(module.register_forward_hook(lambda _m, _i, out, l=l: seen.__setitem__(l, out[0])))
    try:
        with torch.no_grad(), fp64_throughout():
            logits, cache = m.run_with_cache(x)
    finally:
        for h in handles:
            h.remove()
    return logits, cache, seen


def logits(m, x, fwd_hooks=()) -> torch.Tensor:
    with torch.no_grad(), fp64_throughout():
        out = m.run_with_hooks(x, fwd_hooks=list(fwd_hooks)) if fwd_hooks else m(x)
    return out.logits if hasattr(out, "logits") else out


# --- rotary: transformers' own -------------------------------------------------------------------------------------


def hf_rotary(ref, l: int, q, k):
    """q, k (B,T,heads,dh) turned by the HF model's own rotary embedding and its modeling file's apply_rotary_pos_emb
    at positions 0 .. T-1 (unchanged where the family has no rotary)."""
    rope = getattr(ref.base_model, "rotary_emb", None)
    if rope is None:
        return q, k
    modeling = importlib.import_module(type(ref).__module__)
    h = torch.zeros(1, q.shape[1], 1, dtype=q.dtype)
    position_ids = torch.arange(q.shape[1])[None]
    types = getattr(ref.config, "layer_types", None)
    with fp64_throughout():
        if "layer_type" in inspect.signature(rope.forward).parameters:  # Gemma 3: local and global bases
            cos, sin = rope(h, position_ids, types[l])
        else:
            cos, sin = rope(h, position_ids)
        qr, kr = modeling.apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
    return qr.transpose(1, 2), kr.transpose(1, 2)


def test_hf_rot_q_is_the_models_own_rotary_of_q_normed_or_q(hf):
    model_type, ref, m = hf
    _, cache, _ = cached_with_module_outputs(m, ids())
    for l in m.probe_info.attention_layers:
        q = cache.get(names.attn(l, "q_normed"), cache[names.attn(l, "q")])
        k = cache.get(names.attn(l, "k_normed"), cache[names.attn(l, "k")])
        want_q, want_k = hf_rotary(ref, l, q, k)
        torch.testing.assert_close(cache[names.rot(l, "q")], want_q, atol=EXACT, rtol=0)
        torch.testing.assert_close(cache[names.rot(l, "k")], want_k, atol=EXACT, rtol=0)
    assert (names.attn(0, "q_normed") in m.hook_dict) == (model_type in QK_NORMED)
    assert "attn.hook_q_normed" not in m.probe_info.absent_hooks  # no QK-norm: no such tensor, nothing lacking


def test_probe_rot_q_is_the_models_rotary_of_q_normed_or_q(own):
    _, model = own
    _, cache, _ = cached_with_module_outputs(model, ids())
    for l, block in enumerate(model.blocks):
        q = cache.get(names.attn(l, "q_normed"), cache[names.attn(l, "q")])
        k = cache.get(names.attn(l, "k_normed"), cache[names.attn(l, "k")])
        torch.testing.assert_close(cache[names.rot(l, "q")], block.attn.rotary(q), atol=EXACT, rtol=0)
        torch.testing.assert_close(cache[names.rot(l, "k")], block.attn.rotary(k), atol=EXACT, rtol=0)
    assert (names.attn(0, "q_normed") in model.hook_dict) == bool(model.config.qk_norm)


# --- scores, pattern, z, result ------------------------------------------------------------------------------------


def check_scores_pattern_z_result(m, x):
    _, cache, written = cached_with_module_outputs(m, x)
    G = m.probe_info.kv_group
    for i, l in enumerate(m.probe_info.attention_layers):
        scores, pattern = cache[names.attn(l, "attn_scores")], cache[names.attn(l, "pattern")]  # B,H,T,T
        sink = cache.get(names.attn(l, "sink_logit"))
        if sink is not None:  # the phantom's logit joins each row; its mass is what the real keys leave
            column = sink.double()[None, :, None, None].expand(*scores.shape[:3], 1)
            probs = torch.softmax(torch.cat([scores.double(), column], -1), -1)
            torch.testing.assert_close(cache[names.attn(l, "phantom")].double(), probs[..., -1], atol=EXACT, rtol=0)
            probs = probs[..., :-1]
        else:
            probs = torch.softmax(scores.double(), -1)
        torch.testing.assert_close(probs, pattern.double(), atol=EXACT, rtol=0)
        assert torch.isneginf(scores[..., 0, 1:]).all()  # keys a row cannot see: -inf, as TransformerLens
        v = cache[names.attn(l, "v_out")].double().repeat_interleave(G, dim=2)  # B,T,H,dv
        z = torch.einsum("bhqk,bkhd->bqhd", pattern.double(), v)
        torch.testing.assert_close(z, cache[names.attn(l, "z")].double(), atol=EXACT, rtol=0)
        module = attention_modules(m)[i]
        out = hf_attention.out_projection(module) if hasattr(m, "hf_model") else module.o_proj
        bias = 0 if out.bias is None else out.bias
        summed = cache[names.attn(l, "result")].sum(2) + bias  # B,T,d
        torch.testing.assert_close(summed, written[i], atol=EXACT, rtol=0)


def test_hf_scores_pattern_z_and_result(hf):
    _, _, m = hf
    check_scores_pattern_z_result(m, ids())


def test_probe_scores_pattern_z_and_result(own):
    _, model = own
    check_scores_pattern_z_result(model, ids())


# --- edits ----------------------------------------------------------------------------------------------------------


def zero_head(x: torch.Tensor, hook=None) -> torch.Tensor:  # B,T,heads,dh
    x = x.clone()
    x[:, :, EDITED_HEAD] = 0
    return x


def projection_edit(model_type: str, attn, dh: int, H: int):
    """(module, forward hook) zeroing head EDITED_HEAD's query in the model's own (possibly fused) projection."""
    h = EDITED_HEAD
    if model_type == "gpt2":  # c_attn: q | k | v, each H·dh wide

        def edit(_m, _i, out):
            out = out.clone()
            out[..., h * dh : (h + 1) * dh] = 0
            return out

        return attn.c_attn, edit
    if model_type == "gpt_neox":  # query_key_value viewed (B,T,H,3·dh): q | k | v per head

        def edit(_m, _i, out):
            out = out.clone()
            out.view(*out.shape[:2], H, 3 * dh)[..., h, :dh] = 0
            return out

        return attn.query_key_value, edit
    module = attn.qkv_proj if model_type == "phi3" else attn.q_proj  # phi3: q first, H·dh wide

    def edit(_m, _i, out):
        out = out.clone()
        out[..., h * dh : (h + 1) * dh] = 0
        return out

    return module, edit


def test_hf_edit_of_hook_q_is_the_same_edit_on_the_projection(hf):
    model_type, ref, m = hf
    x, info = ids(), m.probe_info
    got = logits(m, x, [(names.attn(0, "q"), zero_head)])
    attn = m.attention_module(m.decoder_layers(ref)[0])  # layer 0's attention in the HF reference
    module, edit = projection_edit(model_type, attn, info.d_head, info.n_heads)
    handle = module.register_forward_hook(edit)
    try:
        with torch.no_grad(), fp64_throughout():
            want = ref(x).logits
    finally:
        handle.remove()
    assert (want - logits(m, x)).abs().max() > 1e-6  # the edit changes the output
    torch.testing.assert_close(got, want, atol=EXACT, rtol=0)


def test_probe_edit_of_hook_q_is_the_same_edit_on_q_proj(own):
    _, model = own
    x, dh = ids(), model.config.d_head
    got = logits(model, x, [(names.attn(0, "q"), zero_head)])

    def edit(_m, _i, out):
        out = out.clone()
        out[..., EDITED_HEAD * dh : (EDITED_HEAD + 1) * dh] = 0
        return out

    handle = model.blocks[0].attn.q_proj.register_forward_hook(edit)
    try:
        want = logits(model, x)
    finally:
        handle.remove()
    torch.testing.assert_close(got, want, atol=EXACT, rtol=0)


@pytest.mark.parametrize("which", ["hf", "probe"])
def test_edits_of_result_and_scores_reach_the_output(which):
    """Zeroing one head's hook_result equals zeroing its hook_z; scores set to 0 on the visible keys (uniform rows)
    equal keys zeroed at hook_rot_k."""
    m = adapt(tiny_model("llama", dtype=torch.float64)) if which == "hf" else create("baseline", tier="tiny").double()
    x = ids()
    clean = logits(m, x)
    by_result = logits(m, x, [(names.attn(0, "result"), zero_head)])
    by_z = logits(m, x, [(names.attn(0, "z"), zero_head)])
    assert (by_result - clean).abs().max() > 1e-3
    torch.testing.assert_close(by_result, by_z, atol=EXACT, rtol=0)

    def flat(scores, hook):
        return torch.where(torch.isfinite(scores), torch.zeros_like(scores), scores)

    by_scores = logits(m, x, [(names.attn(0, "attn_scores"), flat)])
    by_keys = logits(m, x, [(names.rot(0, "k"), lambda k, hook: torch.zeros_like(k))])
    assert (by_scores - clean).abs().max() > 1e-3
    torch.testing.assert_close(by_scores, by_keys, atol=EXACT, rtol=0)


# --- parity and cost ------------------------------------------------------------------------------------------------


def test_hf_logits_with_every_hook_equal_hf_eager(hf):
    _, ref, m = hf
    x = ids()
    with torch.no_grad(), fp64_throughout():
        want = ref(x).logits
    got, cache, _ = cached_with_module_outputs(m, x)
    torch.testing.assert_close(got, want, atol=EXACT, rtol=0)
    assert not set(m.hook_dict) - set(cache)  # every point the adapter created fired


def test_nothing_lazy_is_computed_when_nobody_asks(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("scores computed on a forward that asked for none")

    def no_result(*args, **kwargs):
        raise AssertionError("hook_result computed on a forward that asked for none")

    monkeypatch.setattr(hf_attention, "attention_scores", refuse)
    monkeypatch.setattr(probe_attention, "attention_scores", refuse)
    m, model = adapt(tiny_model("llama")), create("baseline", tier="tiny")
    monkeypatch.setattr(m.blocks[0].attn.hook_result, "forward", no_result)
    monkeypatch.setattr(model.blocks[0].attn.hook_result, "forward", no_result)
    with torch.no_grad():
        m(ids())
        model(ids())
        m.run_with_cache(ids(), names_filter=lambda n: n.endswith("hook_v"))


def test_families_without_a_readable_query_list_hook_q_as_absent():
    """A latent attention (DeepSeek-V3) and an interleaved rotary over a fused projection (CodeGen) have no query
    before rotary that probe can read: no hook_q point, and ModelInfo says so."""
    for model_type in ("deepseek_v3", "codegen"):
        m = adapt(tiny_model(model_type))
        assert names.attn(0, "q") not in m.hook_dict and names.rot(0, "q") in m.hook_dict
        assert {"attn.hook_q", "attn.hook_k"} <= set(m.probe_info.absent_hooks)
        assert m.probe_info.lacks(names.attn(0, "q"))
