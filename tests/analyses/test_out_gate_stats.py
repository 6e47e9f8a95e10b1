"""Output-gate (G1) statistics and clamps: gate_stats over rows equals its definition computed from hook_out_gate
by hand (docs/definitions.md#gate-statistics), and `ablate(..., ["gate"])` holds hook_out_gate open, closed or at its
clean-pass mean with the losses the same edits give by hand (docs/definitions.md#ablations)."""

import pytest
import torch

from probe.analyses.ablate import AblationError, ablate
from probe.analyses.gates import gate_stats
from probe.hooks import names
from tests.support.analyses import tiny, windows

FORMS = ["outgate", "outgate-head"]
W = windows(2, 3, 12, vocab=40)


def _gates(model, tokens) -> list[torch.Tensor]:
    """Every layer's hook_out_gate over every window, (N·B, T, H, C) float64 (C = 1 headwise)."""
    out = {l: [] for l in range(model.probe_info.n_layers)}
    for ids in tokens[..., :-1]:
        _, cache = model.run_with_cache(ids, names_filter=lambda n: names.is_attn(n, "out_gate"))
        for l in out:
            g = cache[names.attn(l, "out_gate")].double()
            out[l].append(g if g.dim() == 4 else g[..., None])
    return [torch.cat(out[l]) for l in sorted(out)]


@pytest.mark.parametrize("variant", FORMS)
def test_output_gate_statistics_equal_their_definition(variant):
    model = tiny(variant, n_kv_heads=2)
    got = gate_stats(model, W, min_count=1)
    assert got["meta"]["gate"].iloc[0] == "output"
    for l, g in enumerate(_gates(model, W)):
        rows = g[:, 1:]  # rows t >= 1
        m = rows.mean(-1)  # the row's gate, (n, T-1, H)
        heads = got["heads"][got["heads"]["layer"] == l].set_index("head")
        for h in range(model.probe_info.n_heads):
            sd = rows[:, :, h].reshape(-1, rows.shape[-1]).std(0, unbiased=False).mean()  # per coordinate, averaged
            assert heads.at[h, "mean_gate"] == pytest.approx(float(m[..., h].mean()), rel=1e-6)
            assert heads.at[h, "selectivity"] == pytest.approx(float(sd), rel=1e-5, abs=1e-9)
            assert heads.at[h, "spread"] == pytest.approx(float(m[..., h].std(unbiased=False)), rel=1e-5, abs=1e-9)
            every = g[:, :, h].mean(-1)  # per read: every row, t = 0 included
            assert heads.at[h, "read_mean_gate"] == pytest.approx(float(every.mean()), rel=1e-6)
            assert heads.at[h, "frac_below_half"] == pytest.approx(float((every < 0.5).double().mean()))
    s, meta = got["summary"].iloc[0], got["meta"].iloc[0]
    assert meta["out_gate"] == model.probe_info.out_gate and 0 <= s["token_share"] <= 1
    assert list(got["heads"]["kv_head"]) == [h // 2 for _ in range(2) for h in range(4)]  # 4 heads on 2 KV heads
    if variant == "outgate-head":  # one gate per head: its query dependence is the spread of the row gates
        assert got["heads"]["selectivity"].tolist() == pytest.approx(got["heads"]["spread"].tolist())


def test_per_token_means_are_the_query_tokens_gates():
    model = tiny("outgate-head")
    got = gate_stats(model, W, min_count=1)["tokens"].set_index("token_id")
    gates = torch.stack([g[..., 0] for g in _gates(model, W)])  # (L, n, T, H)
    ids = W[..., :-1].reshape(-1, W.shape[-1] - 1)
    for t in (int(ids[0, 0]), int(ids[1, 5])):
        want = gates[:, ids == t].mean()
        assert got.at[t, "mean_gate"] == pytest.approx(float(want), rel=1e-6)


def test_a_model_without_that_gate_is_refused():
    with pytest.raises(ValueError, match="has no output gate"):
        gate_stats(tiny("normgate"), W, gate="output")
    with pytest.raises(ValueError, match="has no value gate"):
        gate_stats(tiny("outgate"), W, gate="value")
    with pytest.raises(ValueError, match="unknown gate 'both'; choose from value, output"):
        gate_stats(tiny("outgate"), W, gate="both")


def _loss(model, hooks) -> float:
    total = n = 0
    with torch.no_grad():
        for x in W:
            logits = model.run_with_hooks(x[:, :-1], fwd_hooks=hooks)
            total += float(torch.nn.functional.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten(), reduction="sum"))
            n += x[:, 1:].numel()
    return total / n


@pytest.mark.parametrize("variant", FORMS)
def test_gate_clamps_hold_the_output_gate(variant):
    model = tiny(variant, n_kv_heads=2)
    res = ablate(model, W, ["gate"], per_head=True, progress=False)["results"].set_index(["setting", "scope"])
    every = lambda n: names.is_attn(n, "out_gate")  # noqa: E731
    opened = _loss(tiny("baseline", n_kv_heads=2), [])  # g = 1 everywhere: the baseline of the same seed
    assert res.loc[("open", "model"), "loss_ablated"] == pytest.approx(opened, rel=1e-5)
    closed = _loss(model, [(every, lambda g, hook: torch.zeros_like(g))])
    assert res.loc[("closed", "model"), "loss_ablated"] == pytest.approx(closed, rel=1e-6)
    means = {}
    for l, g in enumerate(_gates(model, W)):
        means[names.attn(l, "out_gate")] = g.mean((0, 1)).squeeze(-1).float()  # (H, dv) or (H,) over every position
    at_mean = _loss(model, [(every, lambda g, hook: means[hook.name].expand_as(g).to(g.dtype))])
    assert res.loc[("mean", "model"), "loss_ablated"] == pytest.approx(at_mean, rel=1e-5)
    heads = res.xs("head", level="scope")
    info = model.probe_info
    assert len(heads) == 3 * info.n_layers * info.n_heads and info.n_kv_heads < info.n_heads  # query heads


def test_gate_clamps_still_refuse_a_model_without_a_gate():
    with pytest.raises(AblationError, match="no value gate or output gate"):
        ablate(tiny("baseline"), W, ["gate"], progress=False)
