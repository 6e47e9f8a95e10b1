"""TransformerLens's vocabulary beyond attention with one meaning on probe's models and on HF checkpoints
(docs/definitions.md#hook-namespace), in fp64:

* ``blocks.{l}.{ln1,ln2,ln1_post,ln2_post}`` / ``ln_final``: hook_scale is √(mean((x − mean)²) + eps) of the norm's
  input (RMSNorm: uncentred), hook_normalized (x − mean) / scale, and the norm's output hook_normalized · w + b
  (Gemma: 1 + w); an edit of either equals the same edit of the norm's output made by hand;
* ``mlp.hook_pre`` / ``hook_pre_linear`` / ``hook_post``: hook_post = act(hook_pre) [· hook_pre_linear], the output
  projection of hook_post is hook_mlp_out (no post-norm), and an edit of each equals the same edit of the model's own
  projection; a non-gated MLP has no hook_pre_linear, an MoE block none of them;
* MoE: hook_expert_indices are the top-k of softmax(hook_router_logits), hook_expert_weights the renormalised top-k
  probabilities (0 elsewhere); edits of the logits, indices and weights equal the same edits inside HF's router;
* ``unembed.hook_in``: the final norm of the last resid_post, and the unembedding of it is the logits (Gemma 2: with
  its final soft-cap); ``hook_pos_embed``: hook_embed + hook_pos_embed is blocks.0.hook_resid_pre (GPT-2), and
  only models with learned positions have it;
* with every hook on, the logits are HF eager's; a structure the adapter cannot describe gets no point and is listed
  in ModelInfo.absent_hooks.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from probe.checkpoints.adapters import adapt
from probe.checkpoints.tiny import tiny_model
from probe.hooks import names
from probe.models import create
from tests.support.parity import fp64_throughout

B, T = 2, 10
EXACT = 1e-10
HF_TYPES = ("gpt2", "llama", "gemma2", "gemma3_text", "olmo2", "gpt_neox", "phi3", "mixtral", "qwen3_moe")
PROBE_MODELS = {  # probe's baseline (RMSNorm, SwiGLU, rotary); a GPT-2-style one (LayerNorm with bias, GELU, positions)
    "probe": dict(),
    "probe-gpt2": dict(norm="layer", norm_bias=True, mlp="gelu", pos="learned"),
}
CENTRED = {"gpt2", "gpt_neox", "probe-gpt2"}  # LayerNorms; the rest RMSNorms
ONE_PLUS = {"gemma2", "gemma3_text"}  # gain 1 + w
GATED = {"llama", "gemma2", "gemma3_text", "olmo2", "phi3", "probe"}
MOE = {"mixtral", "qwen3_moe"}
LEARNED_POSITIONS = {"gpt2", "probe-gpt2"}
NORMS = {"olmo2": ("ln1_post", "ln2_post"), "gemma2": names.NORMS, "gemma3_text": names.NORMS}  # else ln1, ln2
POST_NORMED_MLP = {"olmo2", "gemma2", "gemma3_text"}
# the MLP's projections as each family names them: (pre, pre_linear, post); phi3's pre is gate_up_proj's first half
PROJECTIONS = {
    "gpt2": ("c_fc", None, "c_proj"),
    "gpt_neox": ("dense_h_to_4h", None, "dense_4h_to_h"),
    "phi3": ("gate_up_proj", "gate_up_proj", "down_proj"),
    "probe": ("gate", "up", "down"),
    "probe-gpt2": ("up", None, "down"),
}


def ids() -> torch.Tensor:
    return torch.randint(2, 90, (B, T), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module", params=HF_TYPES + tuple(PROBE_MODELS))
def case(request):
    """(name, hooked model, reference): HF's eager model beside an adapter on its copy, or probe's model twice."""
    if request.param in PROBE_MODELS:
        model = create("baseline", tier="tiny", seed=0, **PROBE_MODELS[request.param]).double().eval()
        if request.param == "probe-gpt2":  # a bias that is not zero, so the tests see it
            with torch.no_grad():
                for module in model.modules():
                    if isinstance(module, torch.nn.LayerNorm):
                        module.bias.normal_(0, 0.1, generator=torch.Generator().manual_seed(1))
        return request.param, model, model
    ref = tiny_model(request.param, dtype=torch.float64).eval()
    return request.param, adapt(copy.deepcopy(ref)), ref


@pytest.fixture(scope="module", params=sorted(MOE))
def moe(request):
    ref = tiny_model(request.param, dtype=torch.float64).eval()
    return request.param, adapt(copy.deepcopy(ref)), ref


def run(m, x, fwd_hooks=()) -> torch.Tensor:
    with torch.no_grad(), fp64_throughout():
        out = m.run_with_hooks(x, fwd_hooks=list(fwd_hooks)) if fwd_hooks else m(x)
    return out.logits if hasattr(out, "logits") else out


def cached(m, x, modules=()):
    """(logits, cache of every hook, [(input, output)] of each module in ``modules``) of one forward."""
    seen = {}
    handles = [
        module.register_forward_hook(lambda _m, args, out, i=i: seen.__setitem__(i, (args[0], out)))
        for i, module in enumerate(modules)
    ]
    try:
        with torch.no_grad(), fp64_throughout():
            logits, cache = m.run_with_cache(x)
    finally:
        for h in handles:
            h.remove()
    return logits, cache, [seen[i] for i in range(len(modules))]


def twin(name: str, m, ref, module):
    """The reference model's module at ``module``'s place in the hooked model (probe: the module itself)."""
    if name in PROBE_MODELS:
        return module
    path = next(p for p, mod in m.hf_model.named_modules() if mod is module)
    return ref.get_submodule(path)


def by_hand(ref, x, edits) -> torch.Tensor:
    """The reference's logits with torch hooks ``edits`` [(module, hook, pre)] in place."""
    handles = [
        (module.register_forward_pre_hook(hook) if pre else module.register_forward_hook(hook))
        for module, hook, pre in edits
    ]
    try:
        return run(ref, x)
    finally:
        for h in handles:
            h.remove()


def block_norms(name: str, m) -> list[tuple[int | None, str]]:
    """(layer, which) of every block norm the model has, and (None, ln_final) for the final norm."""
    L = m.probe_info.n_layers
    return [(l, w) for l in range(L) for w in NORMS.get(name, ("ln1", "ln2"))] + [(None, names.FINAL_NORM)]


def norm_of(m, layer: int | None, which: str):
    return m.norm_module(layer, which if layer is not None else "ln1")


def gain_and_bias(name: str, module) -> tuple[torch.Tensor, torch.Tensor | float]:
    gain = 1 + module.weight if name in ONE_PLUS else module.weight
    return gain, 0.0 if getattr(module, "bias", None) is None else module.bias


# --- norms ---------------------------------------------------------------------------------------------------------


def test_norm_points_are_the_norm_written_out(case):
    name, m, _ = case
    norms = block_norms(name, m)
    modules = [norm_of(m, l, w) for l, w in norms]
    _, cache, seen = cached(m, ids(), modules)
    for (l, which), module, (x, out) in zip(norms, modules, seen):
        scale, normalized = cache[names.norm(l, which, "scale")], cache[names.norm(l, which, "normalized")]
        centred = x - x.mean(-1, keepdim=True) if name in CENTRED else x
        eps = getattr(module, "eps", None) or module.variance_epsilon
        assert scale.shape == (B, T, 1) and normalized.shape == (B, T, m.probe_info.d_model)
        torch.testing.assert_close(scale, (centred.pow(2).mean(-1, keepdim=True) + eps).sqrt(), atol=EXACT, rtol=0)
        torch.testing.assert_close(normalized, centred / scale, atol=EXACT, rtol=0)
        gain, bias = gain_and_bias(name, module)
        torch.testing.assert_close(out, normalized * gain + bias, atol=EXACT, rtol=0)
    present = {n for n in m.hook_dict if n.endswith(("hook_scale", "hook_normalized"))}
    assert present == {names.norm(l, w, p) for l, w in norms for p in names.NORM_POINTS}


def doubled_part(point: str, act: torch.Tensor) -> torch.Tensor:
    """Where a norm edit doubles ``act`` in place: hook_scale at the first half of the positions, hook_normalized in
    the first half of the features (not a uniform scale, which a norm downstream would cancel)."""
    return act[:, : act.shape[1] // 2] if point == "scale" else act[..., : act.shape[-1] // 2]


@pytest.mark.parametrize("inplace", [False, True], ids=["returned", "in-place"])
@pytest.mark.parametrize("point", names.NORM_POINTS)
@pytest.mark.parametrize("where", ["block", "final"])
def test_a_norm_edit_equals_the_same_edit_of_the_norms_output(case, where, point, inplace):
    """A doubled hook_scale halves the output less its bias there; a doubled hook_normalized doubles it."""
    name, m, ref = case
    layer, which = block_norms(name, m)[0] if where == "block" else (None, names.FINAL_NORM)
    module = twin(name, m, ref, norm_of(m, layer, which))
    _, bias = gain_and_bias(name, module)

    def edit(act, hook):
        if not inplace:
            act = act.clone()
        doubled_part(point, act).mul_(2.0)
        return None if inplace else act

    def edit_by_hand(_m, _i, out):
        factor = torch.ones_like(out[:1, :, :1] if point == "scale" else out[:1, :1, :])
        doubled_part(point, factor).fill_(0.5 if point == "scale" else 2.0)
        return (out - bias) * factor + bias

    x = ids()
    got = run(m, x, [(names.norm(layer, which, point), edit)])
    torch.testing.assert_close(got, by_hand(ref, x, [(module, edit_by_hand, False)]), atol=EXACT, rtol=0)
    assert (got - run(m, x)).abs().max() > 1e-3  # the edit changed the logits


# --- MLP -------------------------------------------------------------------------------------------------------------


def mlp_of(name: str, m, layer: int):
    if name in PROBE_MODELS:
        return m.blocks[layer].mlp
    return m.mlp_module(m.decoder_layers(m.hf_model)[layer])


def activation(name: str, mlp):
    if name in PROBE_MODELS:
        return F.silu if mlp.kind == "swiglu" else F.gelu
    return next(getattr(mlp, n) for n in ("act_fn", "act", "activation_fn") if hasattr(mlp, n))


def test_mlp_points(case):
    name, m, _ = case
    _, cache, _ = cached(m, ids())
    for l in range(m.probe_info.n_layers):
        has = {p for p in names.MLP_POINTS if names.mlp(l, p) in m.hook_dict}
        if name in MOE:
            assert has == {"router_logits", "expert_indices", "expert_weights"}
            continue
        assert has == ({"pre", "pre_linear", "post"} if name in GATED else {"pre", "post"})
        mlp = mlp_of(name, m, l)
        pre, post = cache[names.mlp(l, "pre")], cache[names.mlp(l, "post")]  # B,T,m
        want = activation(name, mlp)(pre)
        if name in GATED:
            want = want * cache[names.mlp(l, "pre_linear")]
        torch.testing.assert_close(post, want, atol=EXACT, rtol=0)
        if name not in POST_NORMED_MLP:
            out = getattr(mlp, PROJECTIONS.get(name, (None, None, "down_proj"))[2])(post)
            torch.testing.assert_close(out, cache[names.sublayer_out(l, "mlp")], atol=EXACT, rtol=0)


def half(act: torch.Tensor) -> torch.Tensor:
    """act with its first half of features doubled (not a uniform scale, which a post-norm would cancel)."""
    act = act.clone()
    act[..., : act.shape[-1] // 2] *= 2.0
    return act


def projection_edit(name: str, point: str):
    """(projection attribute, torch hook, pre) making the edit :func:`half` of ``point`` in the model's own
    projection."""
    pre, linear, post = PROJECTIONS.get(name, ("gate_proj", "up_proj", "down_proj"))
    if point == "post":
        return post, lambda _m, args: (half(args[0]),), True
    if name == "phi3":  # gate_up_proj: gate | up, m features each

        def fused(_m, _i, out):
            gate, up = out.chunk(2, dim=-1)
            return torch.cat((half(gate), up) if point == "pre" else (gate, half(up)), dim=-1)

        return pre, fused, False
    return (pre if point == "pre" else linear), lambda _m, _i, out: half(out), False


@pytest.mark.parametrize("point", ["pre", "pre_linear", "post"])
def test_an_mlp_edit_equals_the_same_edit_of_the_projection(case, point):
    name, m, ref = case
    if name in MOE or (point == "pre_linear" and name not in GATED):
        pytest.skip(f"{name} has no mlp.hook_{point}")
    layer = m.probe_info.n_layers - 1
    attr, hook, pre = projection_edit(name, point)
    module = twin(name, m, ref, getattr(mlp_of(name, m, layer), attr))
    x = ids()
    got = run(m, x, [(names.mlp(layer, point), lambda act, hook: half(act))])
    torch.testing.assert_close(got, by_hand(ref, x, [(module, hook, pre)]), atol=EXACT, rtol=0)
    assert (got - run(m, x)).abs().max() > 1e-4


# --- mixtures of experts --------------------------------------------------------------------------------------------


def test_expert_indices_are_the_top_k_of_the_routers_softmax(moe):
    name, m, ref = moe
    _, cache, _ = cached(m, ids())
    k = ref.config.num_experts_per_tok
    renormalise = name == "mixtral" or ref.config.norm_topk_prob
    for l in range(m.probe_info.n_layers):
        logits = cache[names.mlp(l, "router_logits")]  # B,T,E
        chosen, weights = cache[names.mlp(l, "expert_indices")], cache[names.mlp(l, "expert_weights")]
        assert chosen.shape == (B, T, k) and chosen.dtype == torch.int64 and weights.shape == logits.shape
        probs = torch.softmax(logits, dim=-1)
        top, index = probs.topk(k, dim=-1)
        assert torch.equal(chosen.sort(-1).values, index.sort(-1).values)
        top = top / top.sum(-1, keepdim=True) if renormalise else top
        want = torch.zeros_like(probs).scatter(-1, index, top)
        torch.testing.assert_close(weights, want, atol=EXACT, rtol=0)


def router_edits(ref, layer: int, point: str):
    """The edit of ``point`` (× 2 logits, × 0.5 weights, the next expert) made by hand on HF's own modules, as
    (module, torch hook, pre) list (the logits: the router's weight doubled, restored by the caller)."""
    block = ref.model.layers[layer].mlp
    E = ref.config.num_local_experts if hasattr(ref.config, "num_local_experts") else ref.config.num_experts
    if point == "expert_weights":
        return [(block.experts, lambda _m, args: (args[0], args[1], args[2] * 0.5), True)]
    return [(block.experts, lambda _m, args: (args[0], (args[1] + 1) % E, args[2]), True)]


@pytest.mark.parametrize("point", ["router_logits", "expert_indices", "expert_weights"])
def test_a_routing_edit_equals_the_same_edit_inside_the_router(moe, point):
    name, m, ref = moe
    layer, x = 0, ids()
    E = m.probe_info.extra.get("n_experts") or ref.model.layers[0].mlp.gate.weight.shape[0]
    edit = {
        "router_logits": lambda act, hook: act * 2.0,
        "expert_indices": lambda act, hook: (act + 1) % E,
        "expert_weights": lambda act, hook: act * 0.5,
    }[point]
    got = run(m, x, [(names.mlp(layer, point), edit)])
    if point == "router_logits":  # logits = x W^T: twice the logits is twice the router's weight
        gate = ref.model.layers[layer].mlp.gate
        with torch.no_grad():
            gate.weight.mul_(2.0)
        try:
            want = run(ref, x)
        finally:
            with torch.no_grad():
                gate.weight.div_(2.0)
    else:
        want = by_hand(ref, x, router_edits(ref, layer, point))
    torch.testing.assert_close(got, want, atol=EXACT, rtol=0)
    assert (got - run(m, x)).abs().max() > 1e-6


# --- positions and the unembedding ---------------------------------------------------------------------------------


def test_unembedding_reads_the_final_norm_and_gives_the_logits(case):
    name, m, _ = case
    logits, cache, _ = cached(m, ids())
    hidden = cache[names.unembed_in()]
    last = cache[names.resid(m.probe_info.n_layers - 1, "post")]
    with torch.no_grad(), fp64_throughout():
        torch.testing.assert_close(norm_of(m, None, "ln1")(last), hidden, atol=EXACT, rtol=0)
        torch.testing.assert_close(m.unembed(hidden), logits, atol=EXACT, rtol=0)  # Gemma 2: its final soft-cap
    if name == "gemma2":
        assert m.hf_model.config.final_logit_softcapping and logits.abs().max() <= m.config.final_logit_softcapping


def test_positions_only_where_learned_and_they_start_the_stream(case):
    name, m, ref = case
    x = ids()
    assert (names.pos_embed() in m.hook_dict) == (name in LEARNED_POSITIONS)
    if name not in LEARNED_POSITIONS:
        return
    _, cache, _ = cached(m, x)
    positions = cache[names.pos_embed()]
    assert positions.shape == (B, T, m.probe_info.d_model)
    start = cache[names.EMBED] + positions
    torch.testing.assert_close(start, cache[names.resid(0, "pre")], atol=EXACT, rtol=0)
    got = run(m, x, [(names.pos_embed(), lambda act, hook: act * 0)])
    if name in PROBE_MODELS:  # its positions are a weight read directly: zero it by hand
        saved = ref.pos_embed.weight.detach().clone()
        with torch.no_grad():
            ref.pos_embed.weight.zero_()
        try:
            want = run(ref, x)
        finally:
            with torch.no_grad():
                ref.pos_embed.weight.copy_(saved)
    else:
        want = by_hand(ref, x, [(ref.transformer.wpe, lambda _m, _i, out: out * 0, False)])
    torch.testing.assert_close(got, want, atol=EXACT, rtol=0)


# --- the whole forward -----------------------------------------------------------------------------------------------


def test_every_hook_fires_and_the_logits_stay_the_models(case):
    name, m, ref = case
    x = ids()
    logits, cache, _ = cached(m, x)
    assert set(m.hook_dict) - set(cache) <= {n for n in m.hook_dict if names.attn_point(n)}  # attention: its own tests
    torch.testing.assert_close(logits, run(ref, x), atol=EXACT, rtol=0)
    torch.testing.assert_close(run(m, x), run(ref, x), atol=EXACT, rtol=0)
    lacking = [p for p in m.probe_info.absent_hooks if p.startswith(("ln", "mlp.", "unembed", "hook_pos_embed"))]
    assert lacking == []


def test_norm_points_fire_without_hooks_when_materialised(case):
    """Norm points are lazy (computed when a hook asks); probe.materialize fires them for tools that add no
    TransformerLens hook (nnsight reads the HookPoint modules' outputs)."""
    import probe

    _, m, _ = case
    point = m.hook_dict[names.norm(None, point="scale")]
    seen = []
    handle = point.register_forward_hook(lambda _m, _i, out: seen.append(out))
    try:
        run(m, ids())
        assert seen == []
        with probe.materialize(m):
            run(m, ids())
    finally:
        handle.remove()
    assert len(seen) == 1 and seen[0].shape == (B, T, 1)


def test_a_structure_the_adapter_cannot_describe_gets_no_points_and_is_listed():
    """An MLP whose output projection does not read act(gate) · up, and a norm whose output is no norm's form: no
    points, and ModelInfo.absent_hooks says so (never a made-up value)."""
    ref = tiny_model("llama", dtype=torch.float64).eval()
    for layer in ref.model.layers:
        layer.mlp.down_proj.register_forward_pre_hook(lambda _m, args: (args[0] * 1.5,))
        layer.input_layernorm.register_forward_hook(lambda _m, _i, out: out + 1.0)
    m = adapt(ref)
    absent = m.probe_info.absent_hooks
    assert {"mlp.hook_pre", "mlp.hook_pre_linear", "mlp.hook_post", "ln1.hook_scale", "ln1.hook_normalized"} <= set(
        absent
    )
    assert not any(n.startswith(("blocks.0.mlp.", "blocks.0.ln1.")) for n in m.hook_dict)
    assert names.norm(0, "ln2", "scale") in m.hook_dict and "ln2.hook_scale" not in absent
