"""docs/how-to/adding-a-mechanism.md, kept honest: a new value gate defined here the way a user would (the gate
module, its registration, a variant name), built, hooked, trained a few steps, saved and reloaded; its parameter
roles declared."""

import pytest
import torch
import torch.nn as nn
from transformers import AutoModelForCausalLM

from probe.data import WindowSampler, eval_batches, load_corpus, load_tokenizer, tokenize_documents
from probe.models import GATES, VARIANTS, ValueGate, add_variant, added_parameters, config_for, create, register_gate
from probe.models.params import parameter_roles
from probe.train.trainer import TrainConfig, evaluate, train
from tests.support import SMALL as TINY_TIER_SHRUNK  # noqa: E402

SMALL = dict(TINY_TIER_SHRUNK, d_model=64, d_mlp=128)


# 1. the gate module: what it computes, its parameters, their roles and initial values
class MeanGate(ValueGate):
    """g_j = σ(s_h · mean(v_j) + c_h) per key and KV head; s = c = 0 at init, so every gate starts at ½."""

    param_roles = {"s": "gate", "c": "gate"}  # no weight decay, kept at their initial value by the model's init

    def __init__(self, config):
        super().__init__()
        self.s = nn.Parameter(torch.zeros(config.n_kv_heads))
        self.c = nn.Parameter(torch.zeros(config.n_kv_heads))

    def forward(self, v, x):  # v: B,T,Hkv,dv -> g: B,T,Hkv, fp32
        return torch.sigmoid(v.float().mean(-1) * self.s.float() + self.c.float())


@pytest.fixture
def registered():
    # 2. its registration (at a module's top level in real code: @register_gate("mean") on the class)
    register_gate("mean")(MeanGate)
    # 3. a variant name for it
    add_variant("meangate", "value gate on the mean of each read", value_gate="mean")
    yield
    GATES.pop("mean")  # leave the registries as the other tests expect them
    VARIANTS.pop("meangate")


def test_the_new_gate_is_built_hooked_and_its_roles_are_declared(registered):
    assert VARIANTS["meangate"] == ("value gate on the mean of each read", {"value_gate": "mean"})
    model = create("meangate", **SMALL)
    assert model.config.probe_variant == "meangate" and isinstance(model.blocks[0].attn.gate, MeanGate)
    roles = parameter_roles(model)
    assert roles["blocks.1.attn.gate.s"] == roles["blocks.1.attn.gate.c"] == "gate"
    assert {"blocks.0.attn.gate.s", "blocks.0.attn.gate.c"} <= model.no_weight_decay()
    assert added_parameters(config_for("meangate", **SMALL)) == {"gate": 2 * 4 * 2, "total": 16}
    ids = torch.randint(0, 8192, (2, 10))
    _, cache = model.run_with_cache(ids)
    g = cache["blocks.0.attn.hook_v_gate"]
    assert g.shape == (2, 10, 4) and torch.equal(g, torch.full_like(g, 0.5))
    torch.testing.assert_close(cache["blocks.0.attn.hook_v_out"], 0.5 * cache["blocks.0.attn.hook_v"])


def test_a_gate_that_does_not_declare_a_parameter_fails_at_once(registered):
    class Careless(MeanGate):
        param_roles = {"s": "gate"}  # forgot c

    register_gate("careless")(Careless)
    try:
        with pytest.raises(ValueError, match=r"attn\.gate\.c"):
            create("baseline", value_gate="careless", **SMALL)
    finally:
        GATES.pop("careless")


def test_the_new_gate_trains_and_reloads(registered, tmp_path):
    tok = load_tokenizer("probe-bpe-8k")
    docs = tokenize_documents(load_corpus("wikitext-2-valid"), tok)
    held_out = eval_batches("wikitext-2-test", tok, n_batches=1, batch_size=8, ctx=64, seed=0)
    torch.manual_seed(0)
    model = create("meangate", seed=0, **SMALL)
    before = evaluate(model, held_out)
    cfg = TrainConfig(steps=40, batch_size=8, lr=3e-3, warmup=5, eval_every=0, ckpt_every=0, log_every=20)
    train(model, WindowSampler(docs, 64, seed=0, eos_id=tok.eos_token_id), cfg, tmp_path / "run", progress=False)
    after = evaluate(model, held_out)
    assert after < before - 1.0, (before, after)
    assert all(blk.attn.gate.s.abs().sum() > 0 for blk in model.blocks)  # the gate learned something
    model.save_pretrained(tmp_path / "model")
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    assert evaluate(again, held_out) == pytest.approx(after, abs=1e-5)


# A gate in the routing slot, added the same way: ``routing = True`` and ``log_gate``. What it does (log g_j on the
# logits) is declared by the gate, so the streaming analyses read hook_v_gate for it without naming it anywhere.
class MeanRoutingGate(MeanGate):
    """log g_j = logsigmoid(s_h · mean(v_j) + c_h) joins key j's logits; the values pass unchanged."""

    routing = True

    def log_gate(self, v, x):  # B,T,Hkv fp32
        return torch.nn.functional.logsigmoid(v.float().mean(-1) * self.s.float() + self.c.float())


@pytest.fixture
def routing_gate():
    register_gate("mean-routing")(MeanRoutingGate)
    add_variant("meanrouting", "routing-slot gate on the mean of each read", value_gate="mean-routing")
    yield
    GATES.pop("mean-routing")
    VARIANTS.pop("meanrouting")


def test_a_new_routing_slot_gate_streams_the_sink_statistics_of_its_pattern(routing_gate):
    from probe.analyses.gates import gate_stats
    from probe.analyses.sinks import sink_stats, sink_stats_reference
    from tests.support.analyses import gate_reference

    model = create("meanrouting", **SMALL)
    assert model.probe_info.has_value_gate and model.probe_info.gate_on_logits  # declared by the gate class
    with torch.no_grad():  # gates far from 1/2, different per KV head, so a dropped log g shows
        for block in model.blocks:
            block.attn.gate.s.copy_(torch.linspace(-40.0, 40.0, block.attn.gate.s.numel()))
            block.attn.gate.c.copy_(torch.linspace(-2.0, 1.0, block.attn.gate.c.numel()))
    toks = torch.randint(0, 8192, (2, 3, 17), generator=torch.Generator().manual_seed(0))
    fast, ref = sink_stats(model, toks), sink_stats_reference(model, toks)
    for key in ("heads", "layers", "summary"):
        a, b = fast[key].select_dtypes("number"), ref[key].select_dtypes("number")
        torch.testing.assert_close(
            torch.tensor(a.to_numpy(float)),
            torch.tensor(b.to_numpy(float)),
            atol=1e-5,
            rtol=1e-5,
            equal_nan=True,
            msg=key,
        )
    gates, ref = gate_stats(model, toks, min_count=1), gate_reference(model, toks)  # gate statistics too
    cols = ["mean_gate", "selectivity", "spread", "read_mean_gate", "frac_below_half", "token_share"]
    torch.testing.assert_close(
        torch.tensor(gates["layers"][cols].to_numpy(float)),
        torch.tensor(ref["layers"][cols].to_numpy(float)),
        rtol=1e-6,
        atol=1e-7,
    )
