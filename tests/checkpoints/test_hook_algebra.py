"""The residual algebra of the HF adapters (docs/definitions.md#hook-algebra), as in TransformerLens:
resid_pre + attn_out == resid_mid and resid_mid + mlp_out == resid_post on every block (a parallel block too, whose
resid_mid is resid_pre + attn_out, so resid_pre + attn_out + mlp_out == resid_post), because hook_attn_out /
hook_mlp_out are exactly what each sub-layer adds to the stream: after a post-norm (OLMo 2), sandwich norms (Gemma
2/3/4, GLM-4, AFMoE, HyperCLOVA X, LFM3), dropout and a residual multiplier (Granite, MiniCPM3, HyperCLOVA X). A
linear-attention / convolution layer (Qwen3-Next, LFM2, OLMo-hybrid) is first-class: its mixer's write is its
hook_attn_out.

On one tiny fp64 model per family: the logits are HF eager's (<= 1e-10), every rule holds to 1e-10, zeroing or
scaling hook_attn_out (hook_mlp_out) of a layer gives the logits HF gives with that write zeroed or scaled inside
its own layer, and the zeroed write leaves resid_mid == resid_pre (resid_post == resid_mid); in training the hooks
see the writes after their dropout; a saved folder loaded by probe.load keeps the algebra. Gemma 4 is the one family
where resid_post is not resid_mid + mlp_out: its layer adds a per-layer-input write and multiplies the stream by a
learned scalar, checked here as that.
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

import probe
from probe.checkpoints.adapters import adapt
from probe.checkpoints.tiny import _randomise_norms, tiny_config, tiny_model
from probe.hooks import names
from tests.support.parity import fp64_throughout, ids

TOL = 1e-10

# model_type -> the HF submodules whose output is the attention's / the MLP's write (up to the layer's multiplier
# and dropout, which keep a zero zero): per layer, the first of each tuple the layer has
WRITES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "llama": (("self_attn",), ("mlp",)),
    "olmo2": (("post_attention_layernorm",), ("post_feedforward_layernorm",)),
    "gemma2": (("post_attention_layernorm",), ("post_feedforward_layernorm",)),
    "gemma3_text": (("post_attention_layernorm",), ("post_feedforward_layernorm",)),
    "gemma4_text": (("post_attention_layernorm",), ("post_feedforward_layernorm",)),
    "glm4": (("post_self_attn_layernorm",), ("post_mlp_layernorm",)),
    "afmoe": (("post_attention_layernorm",), ("post_mlp_layernorm",)),
    "hyperclovax": (("post_norm1",), ("post_norm2",)),
    "granite": (("self_attn",), ("mlp",)),
    "granitemoe": (("self_attn",), ("block_sparse_moe",)),
    "minicpm3": (("self_attn",), ("mlp",)),
    "phi": (("self_attn",), ("mlp",)),
    "gpt_neox": (("attention",), ("mlp",)),
    "gpt2": (("attn",), ("mlp",)),
    "opt": (("self_attn",), ("fc2",)),
    "qwen3_next": (("linear_attn", "self_attn"), ("mlp",)),
    "lfm2": (("conv", "self_attn"), ("feed_forward",)),
    "lfm3": (("post_operator_norm",), ("post_ffn_norm",)),
    "olmo_hybrid": (("linear_attn", "post_attention_layernorm"), ("post_feedforward_layernorm", "mlp")),
    # own attention: HF's BLOOM / MPT modules add the residual after their last projection
    "falcon": (("self_attention.dense",), ("mlp",)),
    "bloom": (("self_attention.dense",), ("mlp.dense_4h_to_h",)),
    "mpt": (("attn.out_proj",), ("ffn.down_proj",)),
}
HYBRIDS = ("qwen3_next", "lfm2", "lfm3", "olmo_hybrid")  # with a linear / convolution layer
MULTIPLIER = 0.37  # a residual_multiplier not 1 where a family's tiny config keeps the default
CONFIG_OVER: dict[str, dict] = {}


def _tiny(model_type: str, **over) -> torch.nn.Module:
    """A tiny fp64 HF model of ``model_type`` (eager attention) with the config keys ``over``, its residual
    multiplier (where it has one) not 1."""
    over = {**CONFIG_OVER.get(model_type, {}), **over}
    if over:  # tiny_model's build, from a changed config
        config = tiny_config(model_type)
        for key, value in over.items():
            setattr(config, key, value)
        torch.manual_seed(0)
        ref = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
        if ref._can_set_experts_implementation():  # an expert loop: the grouped matmul has no fp64
            ref.set_experts_implementation("eager")
        with torch.no_grad():
            _randomise_norms(ref)
        ref = ref.to(torch.float64).eval()
    else:
        ref = tiny_model(model_type, dtype=torch.float64)
    for module in ref.modules():
        if getattr(module, "residual_multiplier", None) == 1.0:
            module.residual_multiplier = MULTIPLIER
    return ref


def _submodule(layer, candidates: tuple[str, ...]):
    for path in candidates:
        module = layer
        for part in path.split("."):
            module = getattr(module, part, None)
        if module is not None:
            return module
    raise AttributeError(f"{type(layer).__name__} has none of {candidates}")


def _residual_errors(cache, n_layers: int) -> dict[str, float]:
    """The largest |difference| of each residual rule over the layers (B,T,d tensors, fp64)."""
    worst = {"mid": 0.0, "post": 0.0, "three": 0.0}
    for l in range(n_layers):
        pre, mid, post = (cache[names.resid(l, kind)] for kind in ("pre", "mid", "post"))
        attn_out, mlp_out = cache[names.sublayer_out(l, "attn")], cache[names.sublayer_out(l, "mlp")]
        for rule, got, want in (
            ("mid", pre + attn_out, mid),
            ("post", mid + mlp_out, post),
            ("three", pre + attn_out + mlp_out, post),
        ):
            worst[rule] = max(worst[rule], float((got - want).abs().max()))
    return worst


def _check_algebra(m, ref, x) -> dict[str, float]:
    """HF eager's logits on both paths, and the residual rules' errors."""
    with torch.no_grad(), fp64_throughout():
        want = ref(x).logits
        fast = m(x).logits
        out, cache = m.run_with_cache(x)
    assert want.abs().max() > 0.05  # the random model is not degenerate
    assert float((fast - want).abs().max()) <= TOL and float((out - want).abs().max()) <= TOL
    return _residual_errors(cache, m.probe_info.n_layers)


@pytest.mark.parametrize("model_type", [t for t in WRITES if t != "gemma4_text"])
def test_each_write_is_what_its_sub_layer_adds(model_type):
    ref = _tiny(model_type)
    m = adapt(copy.deepcopy(ref))
    errors = _check_algebra(m, ref, ids())
    assert max(errors.values()) <= TOL, errors
    if model_type in HYBRIDS:  # a linear layer: its mixer's write and resid_mid, no softmax hooks
        linear = [l for l, kind in enumerate(m.probe_info.layer_types) if kind == "linear"]
        assert linear, m.probe_info.layer_types
        for l in linear:
            assert not hasattr(m.blocks[l], "attn")
            assert {names.sublayer_out(l, "attn"), names.resid(l, "mid")} <= set(m.hook_dict)


def _scaling(factor: float):
    """Forward hook: the module's (first) output times ``factor``."""

    def hook(module, _inputs, output):
        if isinstance(output, tuple):
            return (output[0] * factor, *output[1:])
        return output * factor

    return hook


def _edit(m, ref, x, layer: int, sublayer: str, factor: float):
    """(probe's logits with the write times ``factor`` at its hook, HF's with it scaled in its own layer, the
    stream probe's hooks saw)."""
    candidates = WRITES[ref.config.model_type][sublayer == "mlp"]
    handle = _submodule(m.decoder_layers(ref)[layer], candidates).register_forward_hook(_scaling(factor))
    try:
        with torch.no_grad(), fp64_throughout():
            want = ref(x).logits
    finally:
        handle.remove()
    seen = {}

    def record(t, hook):
        seen[hook.name] = t

    hooks = [(names.sublayer_out(layer, sublayer), lambda t, hook: t * factor)]
    hooks += [(names.resid(layer, kind), record) for kind in ("pre", "mid", "post")]
    with torch.no_grad(), fp64_throughout():
        got = m.run_with_hooks(x, fwd_hooks=hooks)
    return got, want, seen


@pytest.mark.parametrize("model_type", list(WRITES))
def test_an_edited_write_is_the_same_edit_in_hf(model_type):
    """Zeroing hook_attn_out (hook_mlp_out) leaves resid_mid == resid_pre (resid_post == resid_mid), and zeroing or
    scaling it gives HF's logits with the write zeroed or scaled inside its layer; a scale tells the write from the
    output before a norm (a zero does not: a norm of zero is zero)."""
    ref = _tiny(model_type)
    m, x = adapt(copy.deepcopy(ref)), ids()
    with torch.no_grad(), fp64_throughout():
        clean = ref(x).logits
    for layer in range(m.probe_info.n_layers):
        for sublayer, before, after in (("attn", "pre", "mid"), ("mlp", "mid", "post")):
            for factor in (2.5, 0.0):
                got, want, seen = _edit(m, ref, x, layer, sublayer, factor)
                # the write mattered (a random linear layer's write is small: 2e-4 on the logits)
                assert float((want - clean).abs().max()) > 1e4 * TOL, (layer, sublayer, factor)
                assert float((got - want).abs().max()) <= TOL, (layer, sublayer, factor)
            if model_type == "gemma4_text" and sublayer == "mlp":
                continue  # resid_post is not resid_mid + mlp_out there (test_gemma4_resid_post_is_scaled)
            stream = seen[names.resid(layer, after)] - seen[names.resid(layer, before)]  # under the zeroing edit
            assert float(stream.abs().max()) <= TOL, (layer, sublayer)


# (model_type, config keys): parallel and sequential blocks whose writes HF drops out before adding them
DROPPED = [
    ("falcon", {}),  # parallel: one mask on the sum of both writes
    ("falcon", {"parallel_attn": False}),
    ("falcon", {"new_decoder_architecture": True, "num_ln_in_parallel_attn": 2, "num_kv_heads": 2}),
    ("bloom", {}),
    ("mpt", {}),
    ("phi", {}),
    ("gpt_neox", {}),
    ("gpt_neox", {"use_parallel_residual": False}),
]
RESIDUAL_DROPOUTS = ("resid_dropout", "resid_attn_dropout", "post_attention_dropout", "post_mlp_dropout")


@pytest.mark.parametrize(("model_type", "over"), DROPPED)
def test_a_dropped_out_write_is_what_the_hook_sees(model_type, over):
    """In training, dropout on a write comes before its hook: the algebra holds on each forward's own masks."""
    ref = _tiny(model_type, **over)
    if model_type == "falcon":
        ref.config.hidden_dropout = 0.3  # read by each layer at call time
    for name, module in ref.named_modules():
        if name.endswith(RESIDUAL_DROPOUTS) and isinstance(module, torch.nn.Dropout):
            module.p = 0.3
        if isinstance(getattr(module, "hidden_dropout", None), float):  # BLOOM's attention and MLP, MPT's MLP
            module.hidden_dropout = 0.3
    m, x = adapt(copy.deepcopy(ref)), ids()
    with torch.no_grad():
        clean = m(x).logits
        m.train()
        torch.manual_seed(0)
        out, cache = m.run_with_cache(x)
    assert float((out - clean).abs().max()) > 1e-3  # dropout acted
    errors = _residual_errors(cache, m.probe_info.n_layers)
    assert max(errors.values()) <= TOL, errors


GEMMA4_MOE = {"enable_moe_block": True, "num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 16}


@pytest.mark.parametrize("over", [{}, GEMMA4_MOE], ids=["dense", "moe"])
def test_gemma4_resid_post_is_scaled(over):
    """Gemma 4's layer: resid_post = (resid_mid + mlp_out + the per-layer input's write) · layer_scalar, so the
    resid_post rule cannot hold there (the coverage table lists gemma4 / gemma4_text as partial on it); resid_mid's
    rule does, and mlp_out (with an expert block: the MLP's and the experts' writes, each after its norm) is the
    MLP's write an edit changes."""
    ref = _tiny("gemma4_text", **over)
    assert all(layer.enable_moe_block == bool(over) for layer in ref.model.layers)
    with torch.no_grad():
        for l, layer in enumerate(ref.model.layers):
            layer.layer_scalar.fill_(0.5 + 0.25 * l)  # learned in real checkpoints; 1 in a random one
    m, x = adapt(copy.deepcopy(ref)), ids()
    errors = _check_algebra(m, ref, x)
    assert errors["mid"] <= TOL, errors
    assert errors["post"] > 1e-3, errors  # the rule fails, for the reason below
    layers = m.decoder_layers(m.hf_model)
    written = {}
    handles = [
        layer.post_per_layer_input_norm.register_forward_hook(lambda _m, _i, o, l=l: written.__setitem__(l, o))
        for l, layer in enumerate(layers)
    ]
    try:
        with torch.no_grad(), fp64_throughout():
            _, cache = m.run_with_cache(x)
    finally:
        for handle in handles:
            handle.remove()
    for l in range(len(layers)):
        mid, mlp_out = cache[names.resid(l, "mid")], cache[names.sublayer_out(l, "mlp")]
        want = (mid + mlp_out + written[l]) * layers[l].layer_scalar
        assert float((cache[names.resid(l, "post")] - want).abs().max()) <= TOL, l
        got, want, _ = _edit(m, ref, x, l, "mlp", 2.5)
        assert float((got - want).abs().max()) <= TOL, l


@pytest.mark.parametrize("model_type", ["gemma3_text", "olmo2"])
def test_a_saved_folder_loads_with_the_same_algebra(model_type, tmp_path):
    _tiny(model_type).save_pretrained(tmp_path)
    loaded = probe.load(str(tmp_path), dtype=torch.float64)
    # HF's own load of the folder, its fp32 rotary frequencies made fp64 as probe.load makes them
    ref = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float64, attn_implementation="eager")
    ref = ref.to(torch.float64).eval()
    errors = _check_algebra(loaded, ref, ids())
    assert max(errors.values()) <= TOL, errors


@pytest.mark.parametrize("model_type", ["granite", "granitemoe", "hyperclovax"])
def test_hook_embed_is_the_scaled_embedding_the_stream_starts_from(model_type):
    """Granite multiplies embed_tokens' output by embedding_multiplier in the model's forward: hook_embed is the
    product (== blocks.0.hook_resid_pre), and doubling it equals HF with the multiplier doubled."""
    ref = _tiny(model_type)
    assert ref.model.embedding_multiplier not in (0, 1)
    m = adapt(copy.deepcopy(ref))
    x = ids()
    with torch.no_grad(), fp64_throughout():
        _, cache = m.run_with_cache(x)
        got = m.run_with_hooks(x, fwd_hooks=[("hook_embed", lambda t, hook: t * 2)])
        ref.model.embedding_multiplier *= 2
        want = ref(x).logits
    assert float((cache["hook_embed"] - cache[names.resid(0, "pre")]).abs().max()) <= TOL
    assert float((got - want).abs().max()) <= TOL
