"""The typed edits of probe.analyses.interventions: registry, labels, checks, the one statement of the run's
defaults, and an eviction reaching the attention op as its ``edit`` argument."""

import dataclasses

import pytest
import torch

from probe.analyses import ablate as A
from probe.analyses.interventions import KINDS
from probe.hooks import names
from tests.support.analyses import tiny


def test_every_kind_is_registered_in_order_as_a_frozen_dataclass():
    assert tuple(KINDS) == ("knockout", "value", "phantom", "gate", "evict", "depth", "register") == A.INTERVENTIONS
    for name, cls in KINDS.items():
        assert cls.name == name and dataclasses.is_dataclass(cls)
        with pytest.raises(dataclasses.FrozenInstanceError):
            cls().x = 1


@pytest.mark.parametrize(
    "edit, label",
    [
        (A.Knockout(), "key0"),
        (A.ValueEdit("swap"), "swap"),
        (A.PhantomEdit(), "remove"),
        (A.PhantomEdit(2.0), "logit=2"),
        (A.PhantomEdit(-0.5), "logit=-0.5"),
        (A.GateClamp("mean"), "mean"),
        (A.Eviction(4, 64), "k=4,w=64"),
        (A.Eviction(0, 16, "cache"), "k=0,w=16,pos=cache"),
        (A.DepthForcing("residual"), "residual"),
        (A.DepthForcing("drop", "embed"), "drop:embed"),
    ],
)
def test_labels_are_the_setting_column(edit, label):
    abl = A.Ablation(edit, layer=1)
    assert edit.label == label and abl.setting == label and abl.intervention == edit.name and abl.scope == "layer"


@pytest.mark.parametrize(
    "edit, says",
    [
        (A.ValueEdit("half"), "unknown value ablation 'half'; choose from zero, mean, swap"),
        (A.GateClamp("ajar"), "unknown gate clamp 'ajar'; choose from open, closed, mean"),
        (A.Eviction(1, 4, "disk"), "unknown eviction positions 'disk'; choose from original, cache"),
        (A.Eviction(1, 0), "eviction window must be an int 1..2147483647, got 0"),
        (A.Eviction(-1, 4), "kept first keys must be an int 0..2147483647, got -1"),
        (A.DepthForcing("drop", "mlp"), "unknown source category 'mlp'; choose from embed, blocks, partial"),
        (A.PhantomEdit(), "has no phantom key"),
    ],
)
def test_check_is_one_line_naming_the_value_and_the_choices(edit, says):
    with pytest.raises(A.AblationError, match=says.replace("+", "\\+")):
        edit.check(tiny("baseline").probe_info)


def test_plan_and_ablate_share_one_statement_of_the_defaults():
    model = tiny("baseline")
    mech = A.find_mechanisms(model, torch.zeros(1, 4, dtype=torch.long))
    opts = A.AblationOptions()
    conds = A.plan(model, mech, ["evict", "value"], per_layer=False)
    want = [A.Eviction(k, w) for w in opts.windows for k in opts.keep] + [A.ValueEdit(m) for m in opts.value_modes]
    assert [c.edit for c in conds] == want
    with pytest.raises(TypeError, match="unknown ablation option 'window'"):
        A.ablate(model, torch.zeros(1, 1, 5, dtype=torch.long), ["evict"], window=(4,), progress=False)


def test_an_eviction_reaches_the_op_as_its_edit_argument(monkeypatch):
    """The edit each layer's op receives is the Eviction's fields (positions within the cache, with the layer's
    rotary), passed as ``sink_attention(..., edit=...)``; nothing is left on the hook points afterwards."""
    import probe.models.attention as attention

    model = tiny("baseline", n_layers=2)
    model.unfired_points()  # the first hook check's own forward (two tokens), before the op is recorded
    seen = []
    real = attention.sink_attention

    def record(*args, edit=None, **kw):
        seen.append(edit)
        return real(*args, edit=edit, **kw)

    monkeypatch.setattr(attention, "sink_attention", record)
    abl = A.Ablation(A.Eviction(keep=1, window=3, positions="cache"))
    x = torch.randint(0, 90, (1, 12))
    from probe.kernels.sink_attention import edits

    with torch.no_grad(), edits.carried(model):
        model.run_with_hooks(x, fwd_hooks=A.ablation_hooks(model, abl))
    assert [(e.keep, e.window, e.positions, e.rotary is not None) for e in seen] == [(1, 3, "cache", True)] * 2
    assert not any(edits.EDIT_KEY in m.__dict__ for m in model.modules())
    seen.clear()
    with torch.no_grad():
        model.run_with_hooks(x, fwd_hooks=[(names.attn(0, "v_out"), lambda v, hook: None)])
    assert seen == [None, None]  # a clean forward passes no edit


@pytest.mark.parametrize("kind", ["phantom", "gate", "depth"])
def test_a_refusal_for_a_missing_part_names_the_interventions_the_model_takes(kind):
    model = tiny("baseline")  # no phantom key, no gate, no depth routing
    mech = A.find_mechanisms(model, torch.zeros(1, 4, dtype=torch.long))
    with pytest.raises(A.NotTaken, match="; it takes ") as refused:
        A.plan(model, mech, [kind])
    offered = str(refused.value).rsplit("; it takes ", 1)[1].split(", ")
    assert offered == ["knockout", "value", "evict", "register"]
    assert all(A.plan(model, mech, [name], per_layer=False) for name in offered)


@pytest.mark.parametrize("variant", ["sigmoid", "stickbreaking"])
def test_edits_inside_the_attention_op_are_refused_in_one_line_under_another_row_rule(variant):
    """Knockout and eviction are carried out by the softmax op; a rule's op takes no edit, so planning one names the
    model's rule and the interventions it can take, while a value ablation still plans."""
    model = tiny(variant)
    mech = A.find_mechanisms(model, torch.zeros(1, 4, dtype=torch.long))
    for kind in ("knockout", "evict"):
        with pytest.raises(A.NotTaken, match=f"has {variant} attention rows, which take no ") as refused:
            A.plan(model, mech, [kind])
        offered = str(refused.value).rsplit("; it takes ", 1)[1].split(", ")
        assert "value" in offered and not {"knockout", "evict", "phantom", "gate", "depth"} & set(offered)
        for name in offered:  # each one offered plans
            assert A.plan(model, mech, [name], per_layer=False)
    assert A.plan(model, mech, ["value"], per_layer=False)
