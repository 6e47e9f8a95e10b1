"""TransformerLens's return values (probe.models.lens) on probe's models and on the HF adapters, checked against
TransformerLens's own ``TransformerBridge`` (TransformerLens 4's HookedTransformer; the installed 4.x has no
``HookedTransformer`` class) on the same weights and inputs, and against its ``lm_cross_entropy_loss``."""

from __future__ import annotations

import pytest
import torch
from transformer_lens.utilities import lm_cross_entropy_loss
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.modeling_outputs import CausalLMOutputWithPast

import probe
from probe.checkpoints import wrap
from probe.checkpoints.tiny import build_tiny
from probe.hooks import names
from probe.models import create

FAMILIES = ("gpt_neox", "llama")
ATOL = 1e-5
TEXTS = ["w5 w7 w9 w11 w4", "w3 w8"]  # the tiny checkpoints' word-level tokens, unequal lengths


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_lens")
    return {fam: build_tiny(fam, root / fam, seed=3) for fam in FAMILIES}


def fresh_hf(d):
    return AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager", dtype=torch.float32).eval()


def bridge_of(d):
    from transformer_lens.model_bridge import TransformerBridge

    return TransformerBridge.boot_transformers(str(d), hf_model=fresh_hf(d), tokenizer=AutoTokenizer.from_pretrained(d))


def ids(B=2, T=12, seed=0):
    return torch.randint(2, 96, (B, T), generator=torch.Generator().manual_seed(seed))


def assert_same(got, want):
    """The same TransformerLens return value: the same type (tensor, tuple, None) and values."""
    if want is None:
        assert got is None
    elif isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want)
        for g, w in zip(got, want):
            assert_same(g, w)
    else:
        assert isinstance(got, torch.Tensor) and got.shape == want.shape
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("fam", FAMILIES)
@torch.no_grad()
def test_run_with_cache_and_hooks_return_what_transformer_lens_returns(dirs, fam):
    m, bridge, x = probe.load(str(dirs[fam])), bridge_of(dirs[fam]), ids()
    logits, cache = m.run_with_cache(x)
    b_logits, _ = bridge.run_with_cache(x)
    assert_same(logits, b_logits)
    assert logits.shape == (2, 12, 96) and isinstance(cache, dict) and "blocks.1.attn.hook_pattern" in cache
    for rt in ("logits", "loss", "both", None):
        assert_same(m.run_with_hooks(x, return_type=rt), bridge.run_with_hooks(x, return_type=rt))
        assert_same(m.run_with_cache(x, return_type=rt)[0], bridge.run_with_cache(x, return_type=rt)[0])
        assert_same(m(x, return_type=rt), bridge(x, return_type=rt))
    per_token = m.run_with_hooks(x, return_type="loss", loss_per_token=True)
    assert per_token.shape == (2, 11)
    assert_same(per_token, bridge.run_with_hooks(x, return_type="loss", loss_per_token=True))
    assert_same(m(x, return_type="both", loss_per_token=True), bridge(x, return_type="both", loss_per_token=True))
    # TransformerLens's loss: the mean of -log p(token t+1) over B x (T-1) positions
    assert_same(m(x, return_type="loss"), lm_cross_entropy_loss(b_logits, x))
    assert_same(m(x[0], return_type="logits"), bridge(x[0], return_type="logits"))  # 1-D: one sequence
    # hooks fire and edit under every return type, as in TransformerLens
    zero_v = [("blocks.0.attn.hook_v", lambda v, hook: torch.zeros_like(v))]
    assert_same(m.run_with_hooks(x, fwd_hooks=zero_v), bridge.run_with_hooks(x, fwd_hooks=zero_v))
    assert (m.run_with_hooks(x, fwd_hooks=zero_v) - logits).abs().max() > 1e-3
    _, seen = m.run_with_cache(x, return_type=None)
    assert set(seen) == set(cache) - {names.unembed_in()}  # as TransformerLens: no head, so no unembed.hook_in


@pytest.mark.parametrize("fam", FAMILIES)
@torch.no_grad()
def test_text_calls_match_transformer_lens(dirs, fam):
    m, bridge = probe.load(str(dirs[fam])), bridge_of(dirs[fam])
    for bos in (True, False):
        for text in (TEXTS[0], TEXTS):
            assert torch.equal(m.to_tokens(text, prepend_bos=bos), bridge.to_tokens(text, prepend_bos=bos))
        assert m.to_str_tokens(TEXTS[0], prepend_bos=bos) == bridge.to_str_tokens(TEXTS[0], prepend_bos=bos)
        assert m.to_str_tokens(TEXTS, prepend_bos=bos) == bridge.to_str_tokens(TEXTS, prepend_bos=bos)
        assert_same(
            m(TEXTS[0], return_type="both", prepend_bos=bos), bridge(TEXTS[0], return_type="both", prepend_bos=bos)
        )
        got, _ = m.run_with_cache(TEXTS[0], prepend_bos=bos)
        assert_same(got, bridge.run_with_cache(TEXTS[0], prepend_bos=bos)[0])
    # the BOS rule, not TransformerLens's per-architecture default (True for its llama): this tokenizer adds no BOS
    assert m.to_tokens(TEXTS[0])[0, 0].item() == 5
    assert bridge.to_tokens(TEXTS[0])[0, 0].item() == (0 if fam == "llama" else 5)
    tokens = bridge.to_tokens(TEXTS, prepend_bos=False)
    assert m.to_string(tokens) == bridge.to_string(tokens)
    assert m.to_string(tokens[0]) == bridge.to_string(tokens[0])
    assert m.to_str_tokens(tokens[0]) == bridge.to_str_tokens(tokens[0])
    assert m.to_single_token("w9") == bridge.to_single_token("w9") == 9
    # padded texts: the logits of the real tokens as TransformerLens's; the loss leaves the padding out, as
    # TransformerLens's own loss function does given the padding mask (its forward counts the pads on right padding)
    logits, loss = m(TEXTS, return_type="both", prepend_bos=False)
    b_logits = bridge(TEXTS, return_type="logits", prepend_bos=False)
    torch.testing.assert_close(logits[1, :2], b_logits[1, :2], atol=ATOL, rtol=0)
    assert_same(logits, b_logits)
    mask = (tokens != 1) | (torch.arange(tokens.shape[1]) < 1)  # <eos>=1 pads row 1 after its 2 tokens
    assert mask.sum() == 7
    assert_same(loss, lm_cross_entropy_loss(b_logits, tokens, mask))


@torch.no_grad()
def test_probe_models_return_what_transformer_lens_returns():
    model, x = create("sink+proj", tier="tiny", seed=0, n_layers=2), torch.randint(0, 8192, (2, 16))
    out = model(x)
    assert isinstance(out, CausalLMOutputWithPast)  # no return_type: the HF forward
    logits, cache = model.run_with_cache(x)
    assert_same(logits, out.logits)  # the cache takes the pattern path: equal to fp32 rounding
    assert "blocks.1.attn.hook_phantom" in cache
    assert torch.equal(model.run_with_hooks(x), out.logits)
    assert_same(model.run_with_hooks(x, return_type="loss"), lm_cross_entropy_loss(out.logits, x))
    assert_same(model(x, return_type="loss", loss_per_token=True), lm_cross_entropy_loss(out.logits, x, per_token=True))
    assert_same(model(x, return_type="both"), (out.logits, lm_cross_entropy_loss(out.logits, x)))
    assert_same(model(x, return_type="loss"), model(x, labels=x).loss)  # the HF forward's labels loss, the same mean
    assert model.run_with_hooks(x, return_type=None) is None
    _, seen = model.run_with_cache(x, return_type=None)
    assert set(seen) == set(cache) - {names.unembed_in()}  # as TransformerLens: no head, so no unembed.hook_in
    assert model.run_with_cache(x, return_cache_object=False)[1].keys() == cache.keys()
    # text: the shipped tokenizer, no BOS by the rule (probe-bpe-8k has none and the model was not trained with one)
    assert model.to_str_tokens("The tower is tall") == ["The", " tower", " is", " tall"]
    text_logits, _ = model.run_with_cache("The tower is tall")
    assert_same(text_logits, model(model.to_tokens("The tower is tall")).logits)
    assert model.to_string(model.to_tokens("The tower is tall")) == ["The tower is tall"]
    # the analyses' hidden-state forward is unchanged under run_with_hooks
    hidden = model.run_with_hooks(x, return_hidden=True)
    assert hidden.shape == (2, 16, model.config.d_model)
    torch.testing.assert_close(model.unembed(hidden), out.logits)


@torch.no_grad()
def test_text_follows_the_bos_rule_and_prepend_bos_overrides_it():
    model = create("baseline", tier="tiny", seed=0, n_layers=1)
    plain = model.to_tokens("The tower")
    with pytest.raises(ValueError, match="has no BOS token"):
        model.to_tokens("The tower", prepend_bos=True)  # as --bos on a tokenizer without one
    model.train_record = {"bos": True, "bos_id": 0}  # trained with `probe train --bos`: the recorded id first
    assert model.to_tokens("The tower").tolist() == [[0] + plain[0].tolist()]
    assert torch.equal(model.to_tokens("The tower", prepend_bos=False), plain)


@torch.no_grad()
def test_refusals_are_one_line():
    model, x = create("baseline", tier="tiny", seed=0, n_layers=1), torch.randint(0, 8192, (2, 8))
    with pytest.raises(ValueError, match="return_type 'logit'"):
        model.run_with_hooks(x, return_type="logit")
    with pytest.raises(TypeError, match="stop_at_layer"):
        model.run_with_cache(x, stop_at_layer=1)  # never a silent full forward
    with pytest.raises(TypeError, match="exclusive"):
        model(x, return_type="logits", return_hidden=True)
    with pytest.raises(ValueError, match="padded on the right"):
        model(["The tower is tall", "The"], return_type="logits", padding_side="left")
    with pytest.raises(TypeError, match="labels"):
        model(x, labels=x, return_type="loss")


@torch.no_grad()
def test_hf_forward_generate_and_wrap_keep_working(dirs):
    d = dirs["llama"]
    m, ref, x = probe.load(str(d)), fresh_hf(d), ids()
    out = m(x)
    assert hasattr(out, "logits") and not isinstance(out, torch.Tensor)
    torch.testing.assert_close(out.logits, ref(x).logits, atol=ATOL, rtol=0)
    kw = dict(max_new_tokens=4, do_sample=False, pad_token_id=1)
    assert torch.equal(m.generate(x, **kw), ref.generate(x, **kw))
    wrapped = wrap(fresh_hf(d))
    logits, cache = wrapped.run_with_cache(x)
    torch.testing.assert_close(logits, ref(x).logits, atol=ATOL, rtol=0)
    assert "blocks.0.attn.hook_pattern" in cache
    assert hasattr(wrapped(x), "logits")


@pytest.mark.filterwarnings("ignore:LanguageModel is deprecated")
@torch.no_grad()
def test_nnsight_traces_the_hf_forward():
    from nnsight import NNsight

    model, x = create("sink+proj", tier="tiny", seed=0, n_layers=2), torch.randint(0, 8192, (2, 8))
    traced = NNsight(model)
    with traced.trace(x):
        v = traced.blocks[1].attn.hook_v.output.save()
        logits = traced.output.logits.save()
    _, cache = model.run_with_cache(x)
    torch.testing.assert_close(v, cache["blocks.1.attn.hook_v"])
    torch.testing.assert_close(logits, model(x).logits)


def test_a_misspelt_hook_name_is_one_line_with_the_nearest_names(dirs):
    """TransformerLens raises a bare KeyError('blocks.0.hook_resid_pr'); probe names the model and the nearest points,
    on its own models and on the HF adapters, still a KeyError (and a ValueError) for code that catches one."""
    from probe.models.lens import HookNameError

    ids = torch.randint(0, 64, (1, 5))
    for model in (
        create("baseline", "tiny", n_layers=2, d_model=32, n_heads=2, d_mlp=64, vocab_size=64),
        probe.load(str(dirs["llama"])),
    ):
        with pytest.raises(HookNameError) as e:
            model.run_with_hooks(ids, fwd_hooks=[("blocks.0.hook_resid_pr", lambda t, hook: t)])
        assert isinstance(e.value, KeyError) and isinstance(e.value, ValueError)
        message = str(e.value)
        assert "\n" not in message and message.startswith("no hook point 'blocks.0.hook_resid_pr' in model")
        assert "did you mean blocks.0.hook_resid_pre" in message
    out = model.run_with_hooks(ids, fwd_hooks=[(lambda name: name.endswith("resid_pre"), lambda t, hook: t)])
    assert out.shape[:2] == ids.shape  # a name filter (a function) is TransformerLens's to resolve


def test_a_hook_on_a_point_no_mechanism_of_the_model_writes_is_refused_everywhere_a_name_is_given():
    """Every block has every attention point; a baseline fires no gate, sink logit or value-residual point, and a
    hook there (an ablation of a gate it lacks) ran silently never. run_with_hooks, hooks() and add_hook refuse it in
    one line (a filter function is not checked); finding the points runs one forward over two tokens that a hook
    already on the model never sees, and that leaves the random state alone."""
    from probe.models.lens import HookNameError

    model = create("baseline", "tiny", n_layers=2, d_model=32, n_heads=2, d_mlp=64, vocab_size=64)
    ids = torch.randint(0, 64, (1, 5))
    seen = []
    model.add_hook(lambda name: name == "blocks.0.hook_resid_pre", lambda t, hook: seen.append(t.shape[1]))
    state = torch.random.get_rng_state()
    for point in ("blocks.0.attn.hook_v_gate", "blocks.1.attn.hook_out_gate", "blocks.0.attn.hook_sink_logit"):
        with pytest.raises(HookNameError, match=f"never fires '{point}': no mechanism of this model writes it"):
            model.run_with_hooks(ids, fwd_hooks=[(point, lambda t, hook: t)])
        with pytest.raises(HookNameError, match="never fires"):
            model.hooks(fwd_hooks=[(point, lambda t, hook: t)])
        with pytest.raises(HookNameError, match="never fires"):
            model.add_hook(point, lambda t, hook: t)
    assert seen == [] and torch.equal(torch.random.get_rng_state(), state)
    model.reset_hooks(including_permanent=True)
    assert "blocks.1.attn.hook_v_mix" not in create("value-residual", "tiny", n_layers=2).unfired_points()
    gated = create("gatedv", "tiny", n_layers=2, d_model=32, n_heads=2, d_mlp=64, vocab_size=64)
    assert gated.run_with_hooks(ids, fwd_hooks=[("blocks.0.attn.hook_v_gate", lambda t, hook: t)]).shape[:2] == (1, 5)


def test_the_plain_forward_refuses_a_keyword_it_would_drop():
    """model(x, stop_at_layer=1) or a misspelt keyword returned the whole, unchanged forward; HF's callers' keywords
    (use_cache, return_dict, ...) still pass."""
    model = create("baseline", "tiny", n_layers=2, d_model=32, n_heads=2, d_mlp=64, vocab_size=64)
    x = torch.randint(0, 64, (1, 5))
    with pytest.raises(TypeError, match="stop_at_layer= is a TransformerLens HookedTransformer option"):
        model(x, stop_at_layer=1)
    with pytest.raises(TypeError, match="unexpected keyword argument 'retrun_hidden'"):
        model(x, retrun_hidden=True)
    torch.testing.assert_close(model(x, use_cache=False, return_dict=True).logits, model(x).logits)


def test_a_misspelt_cache_name_and_a_batch_of_str_tokens_are_refused():
    """names_filter naming no point gave an empty cache; to_str_tokens of two rows joined them into one list."""
    from probe.models.lens import HookNameError

    model = create("baseline", "tiny", n_layers=2, d_model=32, n_heads=2, d_mlp=64, vocab_size=64)
    ids = torch.randint(0, 64, (2, 5))
    for wanted in ("blocks.0.hook_resid_pr", ["blocks.0.hook_resid_pre", "blocks.9.hook_resid_pre"]):
        with pytest.raises(HookNameError, match="no hook point 'blocks.[09].hook_resid_pr"):
            model.run_with_cache(ids, names_filter=wanted)
    _, cache = model.run_with_cache(ids, names_filter=["blocks.0.hook_resid_pre"])
    assert list(cache) == ["blocks.0.hook_resid_pre"]
    with pytest.raises(ValueError, match=r"to_str_tokens takes one sequence, got token ids of shape \(2, 5\)"):
        model.to_str_tokens(ids)
    assert len(model.to_str_tokens(ids[:1])) == 5 and len(model.to_str_tokens([ids[0], ids[1]])) == 2


def test_a_hook_on_a_point_the_model_never_fires_is_refused_in_one_line():
    """Softmax-free rows have no log-normaliser (hook_lse), rows that are not softmax's no phantom: the points exist
    (one vocabulary) but never fire, so a hook there would silently never run."""
    from probe.models.lens import HookNameError

    model = create("sigmoid", "tiny", n_layers=2, d_model=32, n_heads=2, d_mlp=64, vocab_size=64)
    ids = torch.randint(0, 64, (1, 5))
    for point in ("blocks.1.attn.hook_lse", "blocks.0.attn.hook_phantom"):
        with pytest.raises(HookNameError, match=f"never fires '{point}': it has no attn.hook_") as e:
            model.run_with_hooks(ids, fwd_hooks=[(point, lambda t, hook: t)])
        assert "\n" not in str(e.value)
    assert model.run_with_hooks(ids, fwd_hooks=[("blocks.0.attn.hook_pattern", lambda t, hook: t)]).shape[:2] == (1, 5)
