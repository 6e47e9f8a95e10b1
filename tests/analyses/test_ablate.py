"""Causal interventions (docs/definitions.md#ablations): the invariants of probe.analyses.ablate on small models."""

import pytest
import torch
import torch.nn.functional as F

from probe.analyses.ablate import (
    Ablation,
    AblationError,
    DepthForcing,
    GateClamp,
    Knockout,
    PhantomEdit,
    ValueEdit,
    ablate,
    ablation_hooks,
)
from probe.analyses.capture import loss_forward_kwargs, output_losses
from probe.hooks import names
from probe.models import GATES, ValueGate, register_gate
from tests.support.analyses import tiny, windows

W = windows(n_batches=2, batch=2, ctx=16)


def losses(model, tokens, hooks=()):
    """Mean next-token loss over every window (tokens (N, B, T+1)) with the given forward hooks."""
    total, count = 0.0, 0
    with torch.no_grad():
        for x in tokens:
            out = model.run_with_hooks(x[:, :-1], fwd_hooks=list(hooks), **loss_forward_kwargs(model))
            lost = output_losses(model, out, x[:, 1:]).double()
            total, count = total + float(lost.sum()), count + lost.numel()
    return total / count


def row(result, intervention, setting, layer=-1, **where):
    r = result["results"]
    sel = (r["intervention"] == intervention) & (r["setting"] == setting) & (r["layer"] == layer)
    for k, v in where.items():
        sel &= r[k] == v
    assert sel.sum() == 1, (intervention, setting, layer, where)
    return r[sel].iloc[0]


class FirstKeyClosed(ValueGate):
    """A routing-slot gate with g_0 = 0 (log g_0 = -inf) and g_j = 1 elsewhere: key 0's logits are -inf already."""

    routing = True

    def forward(self, v, x):
        return torch.exp(self.log_gate(v, x))

    def log_gate(self, v, x):
        log_g = torch.zeros(v.shape[:3], dtype=torch.float32, device=v.device)
        log_g[:, 0] = float("-inf")
        return log_g


@pytest.fixture
def first_key_closed():
    register_gate("test-first-key-closed")(FirstKeyClosed)
    yield "test-first-key-closed"
    del GATES["test-first-key-closed"]


def test_knockout_where_key0_logits_are_already_minus_inf_changes_the_loss_by_exactly_0(first_key_closed):
    model = tiny("sinklogit", value_gate=first_key_closed)  # the phantom keeps query 0's row defined
    res = ablate(model, W, ["knockout"], progress=False)["results"]
    assert len(res) == 1 + model.probe_info.n_layers
    assert (res["delta"] == 0.0).all(), res[["layer", "delta"]]
    other = ablate(tiny("sinklogit"), W, ["knockout"], per_layer=False, progress=False)["results"]
    assert (other["delta"] != 0).all()  # the same knockout on the same weights without the closed gate does change it


@pytest.mark.parametrize("variant", ["baseline", "sink+proj"])
def test_knockout_at_layer_l_leaves_the_residual_stream_up_to_l_bit_identical(variant):
    from probe.kernels.sink_attention import edits

    model = tiny(variant, n_layers=3)
    x = W[0, :, :-1]
    l = 1
    seen = {}

    def keep(t, hook):
        seen[hook.name] = t.detach().clone()

    points = [names.resid(i, "pre") for i in range(3)] + [names.resid(l, "post")]
    with torch.no_grad():
        model.run_with_hooks(x, fwd_hooks=[(p, keep) for p in points])
        clean = dict(seen)
        with edits.carried(model):
            model.run_with_hooks(
                x, fwd_hooks=ablation_hooks(model, Ablation(Knockout(), l)) + [(p, keep) for p in points]
            )
    for i in range(l + 1):
        assert torch.equal(seen[names.resid(i, "pre")], clean[names.resid(i, "pre")]), i
    assert not torch.equal(seen[names.resid(l, "post")], clean[names.resid(l, "post")])
    assert not torch.equal(seen[names.resid(l + 1, "pre")], clean[names.resid(l + 1, "pre")])


def test_knockout_and_eviction_build_no_t_by_t_tensor(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("the T x T reference attention ran")

    from probe.kernels.sink_attention import dispatch, reference

    monkeypatch.setattr(reference, "attention_probs", refuse)
    monkeypatch.setattr(dispatch, "sink_attention_reference", refuse)
    res = ablate(tiny("sink+proj"), W, ["knockout", "evict"], keep=(0, 2), windows=(4,), progress=False)["results"]
    assert res["delta"].notna().all() and (res["delta"] != 0).all()


def test_phantom_removal_equals_the_same_weights_with_a_minus_inf_sink():
    model = tiny("sinklogit")
    res = ablate(model, W, ["phantom"], sink_logits=(1.5,), progress=False)
    removed = tiny("sinklogit")
    with torch.no_grad():
        for block in removed.blocks:
            block.attn.sink.fill_(float("-inf"))
    assert row(res, "phantom", "remove")["loss_ablated"] == losses(removed, W)
    fixed = tiny("sinklogit")
    with torch.no_grad():
        fixed.blocks[1].attn.sink.fill_(1.5)
    assert row(res, "phantom", "logit=1.5", 1)["loss_ablated"] == losses(fixed, W)
    with pytest.raises(AblationError, match="no phantom key"):
        ablate(tiny("baseline"), W, ["phantom"], progress=False)


def test_eviction_with_k_plus_w_covering_the_window_equals_the_clean_loss_exactly():
    T = W.shape[-1] - 1
    res = ablate(tiny("sink+proj"), W, ["evict"], keep=(0, 4, T), windows=(T - 4, 3), progress=False)
    for k, w in [(4, T - 4), (T, 3), (T, T - 4)]:
        assert row(res, "evict", f"k={k},w={w}")["delta"] == 0.0
    assert row(res, "evict", "k=0,w=3")["delta"] != 0.0
    late = row(res, "evict", "k=4,w=3")
    assert late["loss_clean_late"] != late["loss_clean"] and pd_notna(late["delta_late"])


def pd_notna(x) -> bool:
    return x == x


def test_eviction_equals_masked_attention_by_hand():
    """Query t sees keys 0..k-1 and t-w+1..t at the original positions: the same loss as editing the pattern."""
    model = tiny("sink+proj")
    k, w = 2, 4
    T = W.shape[-1] - 1
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    evicted = (j > i - w) | (j < k)

    def by_hand(pattern, hook):  # rows renormalised over the kept keys and the phantom
        phantom = 1 - pattern.sum(-1, keepdim=True)
        kept = pattern * evicted
        return kept / (kept.sum(-1, keepdim=True) + phantom)

    res = ablate(model, W, ["evict"], keep=(k,), windows=(w,), progress=False)
    want = losses(model, W, [(lambda n: names.is_attn(n, "pattern"), by_hand)])
    assert row(res, "evict", f"k={k},w={w}")["loss_ablated"] == pytest.approx(want, abs=1e-5)


@pytest.mark.parametrize("variant", ["sink+proj", "baseline"])
def test_cache_positions_equal_each_querys_cache_reencoded_by_hand(variant):
    """pos=cache: query t's scores are those of its cache re-encoded (q and k rotated back from the text's positions
    and again at the cache's, by the layer's own rotary tables), softmaxed with the phantom: the same loss."""
    from transformers.models.llama.modeling_llama import rotate_half

    model = tiny(variant)
    k, w = 2, 4
    T = W.shape[-1] - 1
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    p = i.clamp(max=k + w - 1)  # each query's position in its cache
    kept = (j < k) & (j <= i - w)
    c = torch.where(kept, j, j - i + p)  # each key's
    seen = {}

    def keep(x, hook):
        seen[hook.name] = x

    def by_hand(pattern, hook):  # (B, H, T, T)
        l = names.layer_of(hook.name)
        cos, sin = (t[:, 0].double() for t in model.blocks[l].attn.rotary.tables(T, "cpu", torch.float32))
        q, key = (seen[names.rot(l, x)].double().transpose(1, 2) for x in "qk")  # (B, H, T, dh), rotated in the text
        key = key.repeat_interleave(q.shape[1] // key.shape[1], 1)
        q, key = (x * cos - rotate_half(x) * sin for x in (q, key))  # at position 0
        q = q * cos[p[:, 0]] + rotate_half(q) * sin[p[:, 0]]
        key = key[:, :, None] * cos[c] + rotate_half(key)[:, :, None] * sin[c]  # (B, H, T, T, dh)
        s = torch.einsum("bhtd,bhtjd->bhtj", q, key) / q.shape[-1] ** 0.5
        s = s.masked_fill(~((j <= i) & ((j > i - w) | (j < k))), float("-inf"))
        sink = seen.get(names.attn(l, "sink_logit"))
        if sink is not None:
            s = torch.cat([sink.double()[None, :, None, None].expand(*s.shape[:3], 1), s], -1)
        a = torch.softmax(s, -1)
        return (a[..., 1:] if sink is not None else a).to(pattern.dtype)

    res = ablate(model, W, ["evict"], keep=(k,), windows=(w,), positions=("cache",), progress=False)
    grab = [(lambda n: names.attn_point(n) in ("rot_q", "rot_k", "sink_logit"), keep)]
    want = losses(model, W, grab + [(lambda n: names.is_attn(n, "pattern"), by_hand)])
    got = row(res, "evict", f"k={k},w={w},pos=cache")
    assert got["loss_ablated"] == pytest.approx(want, abs=1e-5)
    assert res["meta"]["eviction_positions"].iloc[0] == "cache"
    original = ablate(model, W, ["evict"], keep=(k,), windows=(w,), per_layer=False, progress=False)
    assert abs(row(original, "evict", f"k={k},w={w}")["loss_ablated"] - got["loss_ablated"]) > 1e-5


def test_cache_positions_are_refused_in_one_line_without_rotary():
    with pytest.raises(AblationError, match="no rotary position embedding in layer 0: eviction at positions within"):
        ablate(tiny("baseline", pos="learned"), W, ["evict"], positions=("cache",), progress=False)
    with pytest.raises(AblationError, match="unknown eviction positions 'text'; choose from original, cache"):
        ablate(tiny("baseline"), W, ["evict"], positions=("text",), progress=False)


def test_uniform_depth_weights_on_a_zero_query_attnres_model_equal_its_clean_loss():
    model = tiny("attnres-full")
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("read.query"):
                p.zero_()
    res = ablate(model, W, ["depth"], depth_modes=("uniform",), progress=False)["results"]
    assert (res["delta"].abs() < 1e-6).all(), res[["site", "delta"]]
    routed = ablate(tiny("attnres-full"), W, ["depth"], depth_modes=("uniform",), per_layer=False, progress=False)
    assert abs(routed["results"]["delta"].iloc[0]) > 1e-3  # a trained-like (random) query is not uniform


def test_ablate_equals_the_same_edits_made_by_hand_with_run_with_hooks():
    model = tiny("sink+proj")
    res = ablate(
        model,
        W,
        ["value", "gate", "phantom", "knockout"],
        value_modes=("zero", "mean", "swap"),
        sink_logits=(0.5,),
        progress=False,
    )
    l = 1

    def value(mode):
        def edit(v, hook):
            v = v.clone()
            v[:, 0] = {"zero": 0 * v[:, 0], "mean": v[:, 1:].mean(1), "swap": v[:, 1]}[mode]
            return v

        return edit

    for mode in ("zero", "mean", "swap"):
        assert row(res, "value", mode, l)["loss_ablated"] == losses(model, W, [(names.attn(l, "v"), value(mode))])
    gates = []
    losses(model, W, [(names.attn(l, "v_gate"), lambda g, hook: gates.append(g.double().mean((0, 1))))])
    mean = torch.stack(gates).mean(0).float()  # equal-sized batches: the mean of batch means
    for mode, fill in (
        ("open", lambda g: torch.ones_like(g)),
        ("closed", lambda g: torch.zeros_like(g)),
        ("mean", lambda g: mean.expand_as(g).clone()),
    ):
        want = losses(model, W, [(names.attn(l, "v_gate"), lambda g, hook, fill=fill: fill(g))])
        assert row(res, "gate", mode, l)["loss_ablated"] == pytest.approx(want, abs=1e-6), mode
    sink = lambda s, hook: torch.full_like(s, 0.5)  # noqa: E731
    assert row(res, "phantom", "logit=0.5", l)["loss_ablated"] == losses(
        model, W, [(names.attn(l, "sink_logit"), sink)]
    )

    def knock(pattern, hook):  # key 0 out of every row (query 0's goes to the phantom), renormalised
        phantom = 1 - pattern.sum(-1, keepdim=True)
        kept = pattern.clone()
        kept[..., 0] = 0
        return kept / (kept.sum(-1, keepdim=True) + phantom)

    want = losses(model, W, [(names.attn(l, "pattern"), knock)])
    got = row(res, "knockout", "key0", l)["loss_ablated"]
    assert got == pytest.approx(want, abs=1e-5)


def test_query_0_keeps_its_clean_row_without_a_phantom():
    """Without a phantom query 0 would see no key: its row stays clean, so position 0's loss is unchanged."""
    from probe.kernels.sink_attention import edits

    model = tiny("baseline")
    x, y = W[0, :, :-1], W[0, :, 1:]
    with torch.no_grad():
        clean = F.cross_entropy(model(x).logits.transpose(1, 2), y, reduction="none")
        with edits.carried(model):
            out = model.run_with_hooks(x, fwd_hooks=ablation_hooks(model, Ablation(Knockout())))
        knocked = F.cross_entropy(out.transpose(1, 2), y, reduction="none")
    torch.testing.assert_close(knocked[:, 0], clean[:, 0], atol=1e-6, rtol=1e-6)
    assert torch.isfinite(knocked).all() and (knocked[:, 1:] - clean[:, 1:]).abs().max() > 1e-3


def test_standard_errors_are_over_batches_of_the_paired_deltas():
    res = ablate(
        tiny("sink+proj"),
        windows(n_batches=3, batch=2, ctx=16),
        ["value"],
        value_modes=("zero",),
        per_layer=False,
        progress=False,
    )
    pb = res["per_batch"]
    assert len(pb) == 3
    assert res["results"]["delta_se"].iloc[0] == pytest.approx(pb["delta"].std(ddof=1) / 3**0.5)
    assert res["results"]["delta"].iloc[0] == pytest.approx(pb["delta"].mean())  # equal batches: pooled = mean


def test_gate_clamps_are_refused_in_one_line_where_they_do_not_apply():
    with pytest.raises(AblationError, match="no value gate"):
        ablate(tiny("baseline"), W, ["gate"], progress=False)
    with pytest.raises(AblationError, match="element-wise"):
        ablate(tiny("gatedv"), W, ["gate"], progress=False)
    with pytest.raises(AblationError, match="no depth routing"):
        ablate(tiny("baseline"), W, ["depth"], progress=False)
    with pytest.raises(AblationError, match="unknown intervention"):
        ablate(tiny("baseline"), W, ["bogus"], progress=False)


@pytest.mark.parametrize("rule, says", [("stickbreaking", True), ("softpick", True), ("sigmoid", False)])
def test_a_phantom_edit_on_a_rule_without_a_phantom_key_says_what_its_hook_phantom_is(rule, says):
    """Rows that sum to at most one fire hook_phantom (their unspent mass), which has no logit to edit."""
    with pytest.raises(AblationError, match="has no phantom key") as e:
        ablate(tiny("baseline", attn_fn=rule), W, ["phantom"], progress=False)
    assert ("has no logit to edit" in str(e.value)) == says and "\n" not in str(e.value)


def test_a_closed_routing_slot_gate_removes_every_key():
    """Without a phantom every row would be empty and keeps its clean row (exactly no change); with one, every row's
    mass goes to the phantom: the same as editing the pattern to zero by hand."""
    res = ablate(tiny("routing-normgate"), W, ["gate"], gate_modes=("closed", "open"), per_layer=False, progress=False)
    assert row(res, "gate", "closed")["delta"] == 0.0 and row(res, "gate", "open")["delta"] != 0.0
    model = tiny("routing-normgate", abstention="sinklogit")
    res = ablate(model, W, ["gate"], gate_modes=("closed",), progress=False)
    want = losses(model, W, [(names.attn(1, "pattern"), lambda p, hook: torch.zeros_like(p))])
    assert row(res, "gate", "closed", 1)["loss_ablated"] == pytest.approx(want, abs=1e-5)


def test_depth_forcings_on_dense_mixes_and_block_sources():
    res = ablate(tiny("mudd"), W, ["depth"], progress=False)["results"]
    assert set(res["setting"]) == {"uniform", "residual"}  # dense mixes take the two forcings only
    assert (res["delta"] != 0).any()
    res = ablate(tiny("attnres-block2"), W, ["depth"], depth_modes=("drop",), progress=False)["results"]
    assert {"drop:embed", "drop:blocks", "drop:partial"} <= set(res["setting"])


def test_a_depth_forcing_no_site_takes_is_one_line_not_an_empty_table():
    """drop on a MUDD model (dense mixes of block states take uniform and residual only) was a KeyError from an empty
    result table."""
    with pytest.raises(
        AblationError, match="depth forcing 'drop' does not apply to model .*choose from uniform, residual$"
    ):
        ablate(tiny("mudd"), W, ["depth"], depth_modes=("drop",), progress=False)
    with pytest.raises(AblationError, match="'drop' does not apply"):  # beside a forcing it takes: not skipped
        ablate(tiny("mudd"), W, ["depth"], depth_modes=("residual", "drop"), progress=False)


@pytest.mark.parametrize(
    "kw, says",
    [
        (dict(keep=(2**70,)), "kept first keys must be an int 0..2147483647"),
        (dict(windows=(2**70,)), "eviction window must be an int 1..2147483647"),
        (dict(windows=(float("nan"),)), "eviction window"),
    ],
)
def test_eviction_positions_past_int64_are_one_line(kw, says):
    with pytest.raises(AblationError, match=says):
        ablate(tiny("baseline"), W, ["evict"], progress=False, **kw)


def test_eviction_with_k_plus_w_past_the_window_counts_no_late_query():
    res = ablate(tiny("baseline"), W, ["evict"], keep=(2**31 - 1,), windows=(2**31 - 1,), progress=False)["results"]
    assert res["delta"].iloc[0] == 0.0 and res["delta_late"].isna().all()


@pytest.mark.parametrize("logit", [1e39, float("inf"), float("nan"), -1e5])
def test_a_sink_logit_beyond_1e4_is_one_line(logit):
    with pytest.raises(AblationError, match="sink logit .* within \\+-10000"):
        ablate(tiny("sinklogit"), W, ["phantom"], sink_logits=(logit,), progress=False)


KINDS = [
    ("knockout", Knockout()),
    ("value", ValueEdit("zero")),
    ("phantom", PhantomEdit()),
    ("gate", GateClamp("open")),
]


@pytest.mark.parametrize("kind, edit", KINDS)
@pytest.mark.parametrize("where", [dict(head=99), dict(head=-1), dict(layer=7), dict(layer=-1)])
def test_every_kind_refuses_a_head_or_layer_the_model_lacks_in_the_same_words(kind, edit, where):
    """A value ablation on head 99 of 4 (or -1) ran and changed nothing; knockout and phantom raised elsewhere."""
    model = tiny("sinklogit", value_gate="proj")
    abl = Ablation(edit, layer=where.get("layer", 0), head=where.get("head"))
    name = "head" if "head" in where else "layer"
    says = f"{kind} ablation: {name} -?\\d+ is not in model .* which has {name}s 0\\.\\."
    with pytest.raises(AblationError, match=says):
        ablation_hooks(model, abl)


def test_a_depth_site_the_model_lacks_is_one_line():
    with pytest.raises(AblationError, match="read site 'blocks.9.attn_in' is not in model"):
        ablation_hooks(tiny("attnres-block2"), Ablation(DepthForcing("uniform"), site="blocks.9.attn_in"))
