"""The generic route and what every adapter refuses: HF's own layer forward under module hooks, hook points that do
not exist where the route cannot see them, and one-line refusals where probe's attention would differ from HF's."""

from __future__ import annotations

import copy

import pytest
import torch

from probe.checkpoints.adapters import GenericAdapter, adapt
from probe.checkpoints.tiny import tiny_model
from probe.hooks import names


def ids(seed=0):
    return torch.randint(2, 90, (2, 12), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def test_generic_route_hooks_equal_hf_module_outputs_and_edits_propagate():
    ref = tiny_model("qwen2")
    m = GenericAdapter(copy.deepcopy(ref))
    x, layer = ids(), ref.model.layers[1]
    seen = {}
    hooks = [
        layer.self_attn.register_forward_hook(lambda _m, _i, o: seen.__setitem__("attn", o[0])),
        layer.mlp.register_forward_hook(lambda _m, _i, o: seen.__setitem__("mlp", o)),
    ]
    hidden = ref(x, output_hidden_states=True).hidden_states
    for h in hooks:
        h.remove()
    _, cache = m.run_with_cache(x)
    torch.testing.assert_close(cache[names.sublayer_out(1, "attn")], seen["attn"], atol=1e-6, rtol=0)
    torch.testing.assert_close(cache[names.sublayer_out(1, "mlp")], seen["mlp"], atol=1e-6, rtol=0)
    torch.testing.assert_close(cache[names.resid(1, "pre")], hidden[1], atol=1e-6, rtol=0)
    # the route names no norm (their roles are unknown to it): its layers' norms are lacking, not made up
    lacking_norms = [names.norm(0, w, p).split(".", 2)[-1] for w in ("ln1", "ln2") for p in names.NORM_POINTS]
    assert names.resid(0, "mid") not in m.hook_dict
    assert sorted(m.probe_info.absent_hooks) == sorted(["hook_resid_mid", *lacking_norms])
    with pytest.raises(Exception, match="hook_resid_mid"):  # a hook on a point that does not exist fails loudly
        m.run_with_hooks(x, fwd_hooks=[(names.resid(0, "mid"), lambda t, hook: t)])
    delta = torch.randn(ref.config.hidden_size, generator=torch.Generator().manual_seed(1))
    handle = layer.register_forward_pre_hook(lambda _m, args: (args[0] + delta,) + args[1:])
    try:
        want = ref(x).logits
    finally:
        handle.remove()
    got = m.run_with_hooks(x, fwd_hooks=[(names.resid(1, "pre"), lambda t, hook: t + delta)])
    assert (want - ref(x).logits).abs().max() > 1e-3
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_an_attention_keyword_probe_does_not_implement_is_one_line():
    m = GenericAdapter(tiny_model("gemma2"))  # the generic route, without Gemma's soft-capped function
    with pytest.raises(ValueError, match=r"attention keyword softcap=2\.0") as e:
        m(ids())
    assert "\n" not in str(e.value)


def test_a_bidirectional_attention_is_refused():
    m = adapt(tiny_model("llama"))
    m.hf_model.model.layers[0].self_attn.is_causal = False
    with pytest.raises(ValueError, match="is_causal=False"):
        m(ids())


def test_an_attention_the_adapter_does_not_describe_is_refused():
    m = adapt(tiny_model("llama"))
    m.hf_model.model.layers[1].self_attn.scaling = 0.5  # a config option the adapter did not follow
    with pytest.raises(ValueError, match="layer 1 ran its attention with scale 0.5") as e:
        m(ids())
    assert "\n" not in str(e.value)


def test_falcon_with_alibi_is_refused_in_one_line():
    from transformers import AutoModelForCausalLM

    from probe.checkpoints.tiny_configs import auto_tiny_config

    config = auto_tiny_config("falcon")
    config.alibi = True
    with pytest.raises(ValueError, match="adds the ALiBi bias twice") as e:
        adapt(AutoModelForCausalLM.from_config(config, attn_implementation="eager"))
    assert "\n" not in str(e.value)


def test_linear_attention_layers_have_no_attention_hooks_and_analyses_read_the_softmax_layers():
    from probe.analyses.ablate import ablate
    from probe.analyses.sinks import sink_stats

    m = adapt(tiny_model("qwen3_next"))
    info = m.probe_info
    assert info.layer_types == ["linear", "full"] and info.has_out_gate and info.out_gate == "elementwise"
    assert names.attn(0, "pattern") not in m.hook_dict and names.attn(1, "out_gate") in m.hook_dict
    assert info.lacks(names.attn(0, "pattern")) and info.lacks(names.attn(1, "pattern")) is None
    windows = torch.randint(2, 90, (1, 2, 13), generator=torch.Generator().manual_seed(0))
    layers = sink_stats(m, windows)["layers"]  # the linear layer listed, marked, with no attention statistic
    assert layers["layer"].tolist() == [0, 1] and layers["layer_type"].tolist() == ["linear", "full"]
    assert layers.loc[layers["layer"] == 0, "pos0_share"].isna().all()
    assert layers.loc[layers["layer"] == 1, "pos0_share"].notna().all()
    results = ablate(m, windows, interventions=("knockout",), progress=False)["results"]
    assert set(results["layer"]) == {-1, 0, 1}  # every softmax layer at once (-1), then each; layer 0 is listed,
    assert results.loc[results["layer"] == 0, "delta"].isna().all()  # marked linear, with no knockout to make


@torch.no_grad()
@pytest.mark.parametrize("model_type", ["qwen3_next", "afmoe"])
def test_the_output_gate_is_sigma_and_hook_z_the_gated_output(model_type):
    """Qwen3-Next: hook_out_gate = σ(gate half of q_proj); AFMoE: σ(gate_proj(x)); hook_z = (attention output) · σ,
    o_proj's input; an edit of the gate reaches the logits as the same edit of HF's product does."""
    ref = tiny_model(model_type)
    m = adapt(copy.deepcopy(ref))
    assert m.probe_info.has_out_gate and m.probe_info.out_gate == "elementwise"
    x, attn = ids(), ref.model.layers[1].self_attn
    seen = {}
    gate_source = attn.q_proj if model_type == "qwen3_next" else attn.gate_proj
    hooks = [
        gate_source.register_forward_hook(lambda _m, _i, o: seen.__setitem__("g", o)),
        attn.o_proj.register_forward_pre_hook(lambda _m, a: seen.__setitem__("o_in", a[0])),
    ]
    ref(x)
    for h in hooks:
        h.remove()
    _, cache = m.run_with_cache(x)
    dh = attn.head_dim
    g = seen["g"]
    if model_type == "qwen3_next":  # each head's query and gate side by side
        gate = torch.chunk(g.view(*g.shape[:-1], -1, dh * 2), 2, dim=-1)[1]
    else:
        gate = g.view(*g.shape[:-1], -1, dh)
    torch.testing.assert_close(cache[names.attn(1, "out_gate")], torch.sigmoid(gate), atol=1e-7, rtol=0)
    assert 0 <= float(cache[names.attn(1, "out_gate")].min()) and float(cache[names.attn(1, "out_gate")].max()) <= 1
    torch.testing.assert_close(cache[names.attn(1, "z")].flatten(2), seen["o_in"], atol=1e-6, rtol=0)
    closed = m.run_with_hooks(x, fwd_hooks=[(names.attn(1, "out_gate"), lambda g, hook: torch.zeros_like(g))])
    handle = attn.o_proj.register_forward_pre_hook(lambda _m, a: (torch.zeros_like(a[0]),))
    try:
        want = ref(x).logits
    finally:
        handle.remove()
    torch.testing.assert_close(closed, want, atol=1e-5, rtol=0)


def test_a_layer_transformers_changed_runs_unreplaced_without_resid_mid(monkeypatch):
    from probe.checkpoints import architectures

    monkeypatch.setattr(architectures, "record", lambda mt: {"layer_hash": "0" * 12})
    with pytest.warns(UserWarning, match="is not the layer"):
        m = adapt(tiny_model("llama"))
    assert m.layer_body is None and "hook_resid_mid" in m.probe_info.absent_hooks
    assert names.resid(0, "mid") not in m.hook_dict


def test_a_structural_copy_drops_the_forwards_an_adapter_installed():
    """GPT-Neo's adapter installs its attention forward on HF's module: wrapping the adapted model's HF model
    again (a structural copy) must not carry the first one's bound forwards along."""
    from probe.checkpoints import wrap

    ref = tiny_model("gpt_neo")
    first = adapt(copy.deepcopy(ref))
    second = wrap(first.hf_model)
    x = ids()
    with torch.no_grad():
        torch.testing.assert_close(second(x).logits, ref(x).logits, atol=1e-5, rtol=0)
        _, cache = second.run_with_cache(x, names_filter=lambda n: n.endswith("hook_pattern"))
    assert set(cache) == {names.attn(l, "pattern") for l in range(2)}
