"""Interop both ways: TransformerLens TransformerBridge / nnsight models → probe.checkpoints.wrap; probe models under
nnsight and TransformerLens tooling; parity with TransformerLens on identical weights."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import probe
from probe.checkpoints import wrap
from probe.checkpoints.adapters import GPTNeoXAdapter, GptOssAdapter, LlamaAdapter
from probe.checkpoints.tiny import build_tiny
from probe.models import create

FAMILIES = ("gpt_neox", "gpt_oss", "llama")
CLASSES = {"gpt_neox": GPTNeoXAdapter, "gpt_oss": GptOssAdapter, "llama": LlamaAdapter}
ATOL = 1e-5
pytestmark = pytest.mark.filterwarnings("ignore:LanguageModel is deprecated")


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_interop")
    return {fam: build_tiny(fam, root / fam, seed=7) for fam in FAMILIES}


def fresh_hf(d):
    return AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager", dtype=torch.float32).eval()


def boot_bridge(d):
    """A TransformerBridge on its own copy of the weights (boot_transformers rewires the HF model it is given)."""
    from transformer_lens.model_bridge import TransformerBridge

    return TransformerBridge.boot_transformers(str(d), hf_model=fresh_hf(d), tokenizer=AutoTokenizer.from_pretrained(d))


def ids(B=2, T=12, seed=0):
    return torch.randint(2, 96, (B, T), generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------ parity with TransformerLens


@pytest.mark.parametrize("fam", FAMILIES)
@torch.no_grad()
def test_parity_with_transformer_bridge(dirs, fam):
    m = probe.load(str(dirs[fam]))
    bridge = boot_bridge(dirs[fam])
    x = ids()
    b_logits, b_cache = bridge.run_with_cache(x)
    out, cache = m.run_with_cache(x)
    assert b_logits.abs().max() > 0.05
    torch.testing.assert_close(out, b_logits, atol=ATOL, rtol=0)
    for l in range(m.probe_info.n_layers):
        a = f"blocks.{l}.attn."
        torch.testing.assert_close(cache[a + "hook_v"], b_cache[a + "hook_v"], atol=1e-6, rtol=0)
        torch.testing.assert_close(cache[a + "hook_pattern"], b_cache[a + "hook_pattern"], atol=1e-6, rtol=0)
        # the bridge has no phantom hook; its rows sum to 1 - phantom
        torch.testing.assert_close(
            cache[a + "hook_phantom"], 1 - b_cache[a + "hook_pattern"].sum(-1), atol=1e-6, rtol=0
        )
        torch.testing.assert_close(cache[a + "hook_z"], b_cache[a + "hook_z"], atol=1e-6, rtol=0)
        for point in ("hook_q", "hook_k", "hook_rot_q", "hook_rot_k"):  # one meaning on both sides (rotary: after)
            if a + point in b_cache:
                want = b_cache[a + point]
                torch.testing.assert_close(cache[a + point], want.view(cache[a + point].shape), atol=1e-6, rtol=0)
        for s in ("pre", "post"):
            torch.testing.assert_close(
                cache[f"blocks.{l}.hook_resid_{s}"], b_cache[f"blocks.{l}.hook_resid_{s}"], atol=1e-6, rtol=0
            )
    if fam == "gpt_oss":
        assert cache["blocks.0.attn.hook_phantom"].min() > 1e-4


# ------------------------------------------------------------------------------ (a) bring your own model


@pytest.mark.parametrize("fam", FAMILIES)
@torch.no_grad()
def test_wrap_transformer_bridge(dirs, fam):
    bridge = boot_bridge(dirs[fam])
    x = ids(seed=1)
    before = bridge(x)
    m = wrap(bridge)
    assert isinstance(m, CLASSES[fam]) and m.tokenizer is bridge.tokenizer
    assert m.probe_info.extra["wrapped"] == "TransformerBridge"
    # parameters are shared with the bridge, not copied (the bridge may hold extra split q/k/v tensors of its own)
    ref = fresh_hf(dirs[fam])
    ours = {p.data_ptr() for p in m.parameters()}
    assert ours <= {p.data_ptr() for p in bridge.original_model.parameters()}
    assert len(list(m.parameters())) == len(list(ref.parameters()))
    torch.testing.assert_close(m(x).logits, ref(x).logits, atol=ATOL, rtol=0)
    _, cache = m.run_with_cache(x, names_filter=lambda n: n.endswith(("hook_pattern", "hook_v")))
    hf_attn = ref(x, output_attentions=True).attentions
    torch.testing.assert_close(cache["blocks.1.attn.hook_pattern"], hf_attn[1], atol=1e-6, rtol=0)
    # the bridge is untouched and still hooks as before
    torch.testing.assert_close(bridge(x), before, atol=0, rtol=0)
    _, b_cache = bridge.run_with_cache(x, names_filter="blocks.0.attn.hook_v")
    torch.testing.assert_close(b_cache["blocks.0.attn.hook_v"], cache["blocks.0.attn.hook_v"], atol=1e-6, rtol=0)
    assert bridge.original_model.config._attn_implementation != "probe"


def test_wrap_rejects_processed_bridge(dirs):
    bridge = boot_bridge(dirs["llama"])
    bridge._weights_processed = True  # what process_weights() sets after folding
    with pytest.raises(ValueError, match="processed"):
        wrap(bridge)


@pytest.mark.parametrize("fam", FAMILIES)
@torch.no_grad()
def test_wrap_nnsight_language_model(dirs, fam):
    from nnsight import LanguageModel

    hf = fresh_hf(dirs[fam])
    tok = AutoTokenizer.from_pretrained(dirs[fam])
    lm = LanguageModel(hf, tokenizer=tok)
    x = ids(seed=2)
    layers = hf.gpt_neox.layers if fam == "gpt_neox" else hf.model.layers
    with lm.trace(x):
        base = (lm.gpt_neox.layers[0] if fam == "gpt_neox" else lm.model.layers[0]).output.save()
    m = wrap(lm)
    assert isinstance(m, CLASSES[fam]) and m.tokenizer is tok
    want = fresh_hf(dirs[fam])(x, output_hidden_states=True)
    torch.testing.assert_close(m(x).logits, want.logits, atol=ATOL, rtol=0)
    _, cache = m.run_with_cache(x, names_filter="blocks.0.hook_resid_post")
    torch.testing.assert_close(cache["blocks.0.hook_resid_post"], base, atol=1e-6, rtol=0)
    # the nnsight model still works, on its own untouched HF model
    assert type(layers[0].__dict__["forward"]).__module__.startswith("nnsight")  # nnsight's, not ours
    assert hf.config._attn_implementation == "eager"
    with lm.trace(x):
        again = (lm.gpt_neox.layers[0] if fam == "gpt_neox" else lm.model.layers[0]).output.save()
    torch.testing.assert_close(again, base, atol=0, rtol=0)


@torch.no_grad()
def test_wrap_plain_hf_model_does_not_mutate_it(dirs):
    hf = fresh_hf(dirs["gpt_oss"])
    m = wrap(hf, name="mine")
    assert m.probe_info.name == "mine" and m.hf_model is not hf
    assert hf.config._attn_implementation == "eager" and m.hf_model.config._attn_implementation == "probe"
    assert all("forward" not in mod.__dict__ for mod in hf.modules())
    assert hf(ids(), output_attentions=True).attentions is not None
    assert m.hf_model.model.layers[0].self_attn.sinks is hf.model.layers[0].self_attn.sinks
    assert wrap(m) is m
    with pytest.raises(TypeError):
        wrap(torch.nn.Linear(2, 2))


def test_wrap_name_goes_to_load(dirs):
    m = wrap(str(dirs["llama"]))
    assert isinstance(m, LlamaAdapter)


# ------------------------------------------------------------------------------ (b) probe models under nnsight / TL


@pytest.mark.parametrize("fam", FAMILIES)
@torch.no_grad()
def test_adapted_model_under_nnsight(dirs, fam):
    from nnsight import LanguageModel, NNsight

    m = probe.load(str(dirs[fam]))
    x = ids(seed=3)
    _, cache = m.run_with_cache(x, names_filter=lambda n: n.startswith("blocks.0"))
    # LanguageModel over the adapted HF model: module outputs are the hooked stream
    lm = LanguageModel(m.hf_model, tokenizer=m.tokenizer)
    with lm.trace(x):
        layer0 = (lm.gpt_neox.layers[0] if fam == "gpt_neox" else lm.model.layers[0]).output.save()
        logits = lm.output.logits.save()
    torch.testing.assert_close(layer0, cache["blocks.0.hook_resid_post"], atol=1e-6, rtol=0)
    torch.testing.assert_close(logits, m(x).logits, atol=0, rtol=0)
    # NNsight over the probe model itself: the §3 HookPoints are modules nnsight can read and write
    m.materialize_patterns = True  # nnsight adds no TransformerLens hooks, so ask for patterns explicitly
    try:
        nm = NNsight(m)
        with nm.trace(x):
            v = nm.blocks[0].attn.hook_v.output.save()
            pattern = nm.blocks[0].attn.hook_pattern.output.save()
        torch.testing.assert_close(v, cache["blocks.0.attn.hook_v"], atol=0, rtol=0)
        torch.testing.assert_close(pattern, cache["blocks.0.attn.hook_pattern"], atol=0, rtol=0)
        with nm.trace(x):
            edited = nm.blocks[0].attn.hook_v.output.clone()
            edited[:, 3] *= 2.5
            nm.blocks[0].attn.hook_v.output = edited
            nn_logits = nm.output.logits.save()
    finally:
        m.materialize_patterns = False

    def scale(v, hook):
        v = v.clone()
        v[:, 3] *= 2.5
        return v

    tl_logits = m.run_with_hooks(x, fwd_hooks=[("blocks.0.attn.hook_v", scale)])
    assert (tl_logits - m(x).logits).abs().max() > 1e-3
    torch.testing.assert_close(nn_logits, tl_logits, atol=1e-6, rtol=0)


@torch.no_grad()
def test_adapted_model_speaks_transformer_lens(dirs):
    from transformer_lens import ActivationCache, HookedRootModule
    from transformer_lens.utilities import get_act_name

    m = probe.load(str(dirs["gpt_oss"]))
    assert isinstance(m, HookedRootModule)
    for short in ("embed", "resid_pre", "resid_mid", "resid_post", "q", "k", "v", "z", "pattern"):
        assert get_act_name(short, None if short == "embed" else 1) in m.hook_dict
    x = ids(B=1)
    _, raw = m.run_with_cache(x, remove_batch_dim=True)
    cache = ActivationCache(raw, m)
    assert cache["pattern", 1].shape == (4, 12, 12)  # remove_batch_dim honoured
    torch.testing.assert_close(cache["v", 0], raw["blocks.0.attn.hook_v"])
    # TL's context manager and permanent-hook bookkeeping work as on any HookedRootModule
    seen = []
    with m.hooks(fwd_hooks=[(lambda n: n.endswith("hook_phantom"), lambda t, hook: seen.append(hook.name))]):
        m(x)
    assert seen == ["blocks.0.attn.hook_phantom", "blocks.1.attn.hook_phantom"]
    m(x)
    assert len(seen) == 2 and not any(hp.has_hooks() for hp in m.hook_dict.values())


# ------------------------------------------------------------------------------ (c) every hook point through nnsight

from tests.support import SMALL as TINY_TIER_SHRUNK  # noqa: E402

SMALL = dict(TINY_TIER_SHRUNK, n_ctx=32, vocab_size=97)


def _uneven(t):
    """An edit that changes what a softmax sees: a different factor per position (dim 1)."""
    w = torch.linspace(0.1, 1.0, t.shape[1]).view(1, -1, *([1] * (t.dim() - 2)))
    return t * w


# (variant, hook, edit, whether the edit can change the output); lazy hook points first: patterns, phantom, gates
# (value slot, element-wise, routing slot), depth weights and routing keys, a hyper-connected model's stream sum
LAZY = [
    ("sink+proj", "blocks.0.attn.hook_pattern", lambda t: t * 0.5, True),
    ("sink+proj", "blocks.1.attn.hook_phantom", lambda t: t * 0, False),  # the phantom's value is 0
    ("sink+proj", "blocks.0.attn.hook_v_gate", _uneven, True),
    ("gatedv", "blocks.1.attn.hook_v_gate", _uneven, True),
    ("routing-normgate", "blocks.0.attn.hook_v_gate", _uneven, True),
    ("attnres-block2", "blocks.1.attn_read.hook_depth_weights", lambda t: t.flip(-1), True),
    ("slr-full-r8", "final_read.hook_depth_weights", lambda t: t.flip(-1), True),
    ("attnres-block2", "blocks.1.mlp_read.hook_routing_keys", lambda t: t * 2.0, True),
    ("hc", "blocks.0.hook_resid_mid", _uneven, True),  # the streams' sum: its edit is spread over the streams
]


def _nnsight_module(nm, name):
    for part in name.split("."):
        nm = nm[int(part)] if part.isdigit() else getattr(nm, part)
    return nm


def _probe_model(variant):
    model = create(variant, seed=1, **SMALL).eval()
    with torch.no_grad():  # non-trivial sinks, gate directions and routing queries
        g = torch.Generator().manual_seed(2)
        for n, p in model.named_parameters():
            if n.endswith(("attn.sink", "gate.w", "read.query")):
                p.copy_(torch.randn(p.shape, generator=g))
    return model


@pytest.mark.parametrize("variant,name,edit,changes", LAZY, ids=[f"{v}:{n}" for v, n, _, _ in LAZY])
@torch.no_grad()
def test_materialize_makes_every_hook_point_readable_and_editable_through_nnsight(variant, name, edit, changes):
    from nnsight import NNsight

    model = _probe_model(variant)
    x = ids(seed=4)
    _, cache = model.run_with_cache(x, names_filter=name)
    nm = NNsight(model)
    with probe.materialize(model):
        with nm.trace(x):
            seen = _nnsight_module(nm, name).output.save()
        with nm.trace(x):
            site = _nnsight_module(nm, name)
            site.output = edit(site.output)
            nn_logits = nm.output.logits.save()
    assert not any(getattr(m, "materialize", False) for m in model.modules())  # switched off again on exit
    # materialised layers take the fp32 reference path, the others the fused one: equal up to fp32 rounding
    torch.testing.assert_close(seen, cache[name], atol=1e-5, rtol=1e-4)
    tl_logits = model.run_with_hooks(x, fwd_hooks=[(name, lambda t, hook: edit(t))])
    torch.testing.assert_close(nn_logits, tl_logits, atol=2e-5, rtol=1e-4)
    assert ((tl_logits - model(x).logits).abs().max() > 1e-3) == changes


@torch.no_grad()
def test_without_materialize_nnsight_cannot_reach_a_lazy_hook_point():
    """The reason for probe.materialize: nnsight adds no TransformerLens hook, so a lazy point never runs."""
    from nnsight import NNsight

    nm = NNsight(_probe_model("sink+proj"))
    with pytest.raises(Exception, match="ran past"):
        with nm.trace(ids()):
            nm.blocks[0].attn.hook_pattern.output.save()


@torch.no_grad()
def test_materialize_on_an_adapted_checkpoint(dirs):
    """The same switch on adapted HF models: patterns and phantom read and edited through nnsight."""
    from nnsight import NNsight

    m = probe.load(str(dirs["gpt_oss"]))
    x = ids(seed=5)
    _, cache = m.run_with_cache(x, names_filter=lambda n: n.startswith("blocks.1.attn.hook_p"))
    nm = NNsight(m)
    with probe.materialize(m):
        assert m.materialize_patterns  # the adapters' property is the same switch
        with nm.trace(x):
            pattern = nm.blocks[1].attn.hook_pattern.output.save()
            phantom = nm.blocks[1].attn.hook_phantom.output.save()
        with nm.trace(x):
            nm.blocks[1].attn.hook_pattern.output = nm.blocks[1].attn.hook_pattern.output * 0.5
            nn_logits = nm.output.logits.save()
    assert not m.materialize_patterns
    torch.testing.assert_close(pattern, cache["blocks.1.attn.hook_pattern"], atol=1e-6, rtol=0)
    torch.testing.assert_close(phantom, cache["blocks.1.attn.hook_phantom"], atol=1e-6, rtol=0)
    tl_logits = m.run_with_hooks(x, fwd_hooks=[("blocks.1.attn.hook_pattern", lambda t, hook: t * 0.5)])
    assert (tl_logits - m(x).logits).abs().max() > 1e-3
    torch.testing.assert_close(nn_logits, tl_logits, atol=1e-5, rtol=0)
