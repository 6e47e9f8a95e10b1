"""probe.train: schedules, weight-decay roles, Muon, the loop, exact resume, checkpoints (tiny models, CPU, fp32)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from torch import nn

from probe.data import EvalBatches, WindowSampler
from probe.kernels.denormals import set_flush_denormal
from probe.train import TrainConfig, evaluate, lm_loss, lr_factor, param_groups, train
from probe.train.checkpoint import find_checkpoint, flatten, load_checkpoint, unflatten
from probe.train.optim import SimpleMuon, _newton_schulz, build_optimizer

VOCAB, CTX, EOS = 64, 32, 0
DOCS = [torch.arange(2_000) % 17 + 1 for _ in range(10)]  # repetitive: a model can learn it in a few steps
CORPUS = torch.cat(DOCS)


class TinySampler(WindowSampler):
    """probe.data's sampler over DOCS, which can also record its batches or die on its ``fail_at``-th draw."""

    def __init__(self, seed=0, fail_at=None, record=None):
        super().__init__(DOCS, CTX, seed, eos_id=EOS)
        self.fail_at, self.calls, self.record = fail_at, 0, record

    def sample(self, batch_size):
        self.calls += 1
        if self.fail_at is not None and self.calls >= self.fail_at:
            raise KeyboardInterrupt("simulated interruption")
        batch = super().sample(batch_size)
        if self.record is not None:
            self.record.append(batch)
        return batch


def hf_model(seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(
        LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=CTX,
            tie_word_embeddings=True,
        )
    )


def tiny_model(seed=0, variant="baseline"):
    """A ~86k-parameter probe model (2 layers, width 64)."""
    from probe.models import create

    return create(
        variant, tier="tiny", seed=seed, n_layers=2, d_model=64, n_heads=2, d_mlp=128, vocab_size=VOCAB, n_ctx=CTX
    )


def eval_windows(n=2, b=4):
    return CORPUS[5 : 5 + n * b * (CTX + 1)].view(n, b, CTX + 1)


def cfg(**kw):
    base = dict(steps=6, batch_size=4, lr=3e-3, warmup=2, log_every=1, ckpt_every=3, eval_every=0, device="cpu")
    if "warmup" not in kw and kw.get("steps", base["steps"]) <= base["warmup"]:
        kw["warmup"] = 0  # what the trainer caps it to anyway, without its warning (tested on its own below)
    return TrainConfig(**{**base, **kw})


def read_metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


# ---- pieces ----------------------------------------------------------------------------------------------


def test_lr_schedules():
    f = lambda s, sched="cosine": lr_factor(s, 100, 10, sched, 0.1, 0.2)  # noqa: E731
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0)
    assert f(10) == pytest.approx(1.0) and f(99) == pytest.approx(0.1)
    assert f(10 + 89 // 2) == pytest.approx(0.55, abs=0.02)  # cosine midpoint
    assert all(f(s) >= f(s + 1) for s in range(10, 99))
    w = lambda s: f(s, "linear-warmdown")  # noqa: E731
    assert w(5) == pytest.approx(0.6) and w(50) == 1.0 and w(79) == 1.0
    assert w(99) == pytest.approx(0.1) and w(89) == pytest.approx(0.55, abs=0.03)
    with pytest.raises(ValueError):
        lr_factor(50, 100, 10, "step")
    # warmup ending at the final step (warmup = steps - 1): the final step still reaches min_ratio, as documented
    assert lr_factor(99, 100, 99, "cosine", 0.1) == pytest.approx(0.1)
    assert lr_factor(98, 100, 99, "cosine", 0.1) == pytest.approx(99 / 99)  # the warmup's last step


class RoleModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 8)
        self.proj = nn.Linear(8, 8, bias=True)
        self.gate_w = nn.Parameter(torch.zeros(2, 8))  # a 2-D gate direction: excluded by role, not by rank
        self.norm = nn.LayerNorm(8)
        self.lm_head = nn.Linear(8, VOCAB, bias=False)

    def no_weight_decay(self):
        return {"gate_w", "norm.weight", "norm.bias", "proj.bias"}


def _names(groups):
    return {k: {n for n, _ in v} for k, v in groups.items()}


def test_weight_decay_by_role_and_muon_split():
    m = RoleModel()
    assert _names(param_groups(m, "adamw")) == {
        "decay": {"embed.weight", "proj.weight", "lm_head.weight"},
        "no_decay": {"proj.bias", "gate_w", "norm.weight", "norm.bias"},
    }
    assert _names(param_groups(m, "muon")) == {
        "muon": {"proj.weight"},
        "adam": {"embed.weight", "lm_head.weight", "proj.bias", "gate_w", "norm.weight", "norm.bias"},
    }
    opt = build_optimizer(m, TrainConfig(weight_decay=0.1))
    assert {g["name"]: g["weight_decay"] for g in opt.param_groups} == {"decay": 0.1, "no_decay": 0.0}
    opt = build_optimizer(m, TrainConfig(optimizer="muon", lr=3e-4))
    assert {g["name"]: (g["base_lr"], g["weight_decay"]) for g in opt.param_groups} == {
        "muon": (1e-3, 0.1),
        "adam": (3e-4, 0.0),
    }
    m.no_weight_decay = lambda: {"gate_weight"}  # a typo must not silently decay the gate
    with pytest.raises(ValueError, match="gate_weight"):
        param_groups(m)


def test_weight_decay_rank_rule_for_models_without_roles():
    m = hf_model()
    groups = _names(param_groups(m, "adamw"))
    two_d = {n for n, p in m.named_parameters() if p.ndim >= 2}
    assert groups["decay"] == two_d and "model.embed_tokens.weight" in two_d
    assert groups["no_decay"] and all("norm" in n for n in groups["no_decay"])
    muon = _names(param_groups(m, "muon"))["muon"]
    assert muon == two_d - {"model.embed_tokens.weight"}  # tied LM head = the embedding: Adam's


def test_newton_schulz_orthogonalises():
    g = torch.randn(16, 40, generator=torch.Generator().manual_seed(0))
    s = torch.linalg.svdvals(_newton_schulz(g).float())
    assert s.min() > 0.5 and s.max() < 1.3  # ~U Vᵀ with singular values in Muon's (0.5, 1.5) band
    assert torch.linalg.svdvals(g).max() / torch.linalg.svdvals(g).min() > 2


@pytest.mark.skipif(not hasattr(torch.optim, "Muon"), reason="torch ships no Muon to compare with")
def test_simple_muon_matches_torch_muon():
    gen = torch.Generator().manual_seed(0)
    w0 = torch.randn(24, 12, generator=gen)
    grads = [torch.randn(24, 12, generator=gen) for _ in range(4)]
    params = [nn.Parameter(w0.clone()), nn.Parameter(w0.clone())]
    opts = [
        torch.optim.Muon([params[0]], lr=1e-2, weight_decay=0.1, adjust_lr_fn="match_rms_adamw"),
        SimpleMuon([params[1]], lr=1e-2, weight_decay=0.1),
    ]
    for g in grads:
        for p, o in zip(params, opts):
            p.grad = g.clone()
            o.step()
    assert not torch.equal(params[0], w0)
    torch.testing.assert_close(params[1], params[0], rtol=0, atol=1e-6)


def test_lm_loss_and_z_loss():
    logits = torch.randn(2, 5, VOCAB, generator=torch.Generator().manual_seed(0)) * 3
    targets = torch.randint(0, VOCAB, (2, 5))
    ce, obj = lm_loss(logits, targets)
    assert ce is obj
    manual = -(logits.log_softmax(-1).gather(-1, targets[..., None])).mean()
    torch.testing.assert_close(ce, manual)
    ce2, obj2 = lm_loss(logits, targets, z_loss=1e-2)
    torch.testing.assert_close(obj2 - ce2, 1e-2 * (logits.logsumexp(-1) ** 2).mean())


def test_checkpoint_tree_roundtrip():
    tree = {
        "state": {0: {"step": torch.tensor(3.0), "buf": torch.randn(2, 2)}},
        "groups": [{"betas": (0.9, 0.95)}],
        "py": (3, (1, 2), None),
        "np": np.arange(5, dtype=np.uint32),
        "x": float("inf"),
    }
    tensors = {}
    back = unflatten(json.loads(json.dumps(flatten(tree, tensors))), tensors)
    assert set(back["state"]) == {0} and torch.equal(back["state"][0]["buf"], tree["state"][0]["buf"])
    assert back["groups"][0]["betas"] == (0.9, 0.95) and back["py"] == (3, (1, 2), None) and back["x"] == math.inf
    assert back["np"].dtype == np.uint32 and (back["np"] == tree["np"]).all()
    with pytest.raises(TypeError):
        flatten({"f": lambda: 0}, {})


# ---- the loop --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_few_steps_lower_the_loss(tmp_path, optimizer):
    c = cfg(
        steps=25, batch_size=8, lr=1e-2, optimizer=optimizer, muon_lr=2e-2, log_every=5, eval_every=10, ckpt_every=0
    )
    ev = eval_windows()
    before = evaluate(tiny_model(), ev)
    final = train(tiny_model(), TinySampler(), c, tmp_path, eval_batches=ev, progress=False)
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == list(range(26))  # step 0 (validation only), then every step (25 // 50 < 5)
    assert [r["step"] for r in rows if "val_loss" in r] == [0, 10, 20, 25]
    assert rows[0]["val_loss"] == pytest.approx(before)
    assert set(final) == {"step", "loss", "lr", "grad_norm", "tokens", "tokens_per_s", "val_loss"}
    assert final == rows[-1] and final["tokens"] == 25 * 8 * CTX
    assert final["lr"] == pytest.approx(1e-3)  # cosine ends at 10 %
    assert final["val_loss"] < before - 1.0, (before, final)
    assert rows[-1]["loss"] < 0.25 * before and before > 3.5  # from ~ln(64) to a fraction of it


def test_grad_norm_is_logged_before_clipping(tmp_path):
    model, probe_copy = tiny_model(), tiny_model()
    record = []
    train(model, TinySampler(record=record), cfg(steps=1, grad_clip=1e-3), tmp_path, progress=False)
    window = record[0]
    loss, _ = lm_loss(probe_copy(window[:, :-1]).logits, window[:, 1:])
    loss.backward()
    manual = torch.cat([p.grad.flatten() for p in probe_copy.parameters()]).norm().item()
    logged = read_metrics(tmp_path)[0]["grad_norm"]
    assert logged == pytest.approx(manual, rel=1e-5) and logged > 1e-2


def test_grad_accum_sees_the_same_batches(tmp_path):
    runs = {}
    for accum in (1, 2):
        record = []
        c = cfg(steps=3, batch_size=8, grad_accum=accum)
        train(tiny_model(), TinySampler(record=record), c, tmp_path / str(accum), progress=False)
        runs[accum] = (record, [r["loss"] for r in read_metrics(tmp_path / str(accum))])
    assert all(torch.equal(a, b) for a, b in zip(runs[1][0], runs[2][0]))
    np.testing.assert_allclose(runs[1][1], runs[2][1], rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="divide"):
        train(tiny_model(), TinySampler(), cfg(batch_size=6, grad_accum=4), tmp_path / "bad", progress=False)


@pytest.mark.parametrize("family,optimizer", [("probe", "adamw"), ("probe", "muon"), ("hf", "adamw")])
def test_exact_resume_after_interruption(tmp_path, family, optimizer):
    c = cfg(steps=7, ckpt_every=3, optimizer=optimizer, z_loss=1e-4, schedule="linear-warmdown")
    ev = eval_windows(1)
    make = tiny_model if family == "probe" else hf_model
    straight_model = make()
    train(straight_model, TinySampler(), c, tmp_path / "a", eval_batches=ev, progress=False)
    straight = read_metrics(tmp_path / "a")

    with pytest.raises(KeyboardInterrupt):  # dies while drawing the batch of step 6: steps 1–5 logged, checkpoint at 3
        train(make(), TinySampler(fail_at=6), c, tmp_path / "b", eval_batches=ev, progress=False)
    assert [r["step"] for r in read_metrics(tmp_path / "b")] == [0, 1, 2, 3, 4, 5]
    resumed_model = make()
    train(resumed_model, TinySampler(), c, tmp_path / "b", eval_batches=ev, progress=False)  # the same command again
    resumed = read_metrics(tmp_path / "b")

    assert [r["step"] for r in resumed] == list(range(8))  # no duplicates after the resume
    for key in ("loss", "grad_norm", "lr", "tokens", "val_loss"):
        assert [r.get(key) for r in resumed] == [r.get(key) for r in straight], key  # bit-exact
    assert resumed[-1]["val_loss"] == straight[-1]["val_loss"]
    for (n, a), (_, b) in zip(straight_model.named_parameters(), resumed_model.named_parameters()):
        assert torch.equal(a, b), n


def test_finished_run_is_not_trained_again(tmp_path):
    c = cfg(steps=3)
    first = train(tiny_model(), TinySampler(), c, tmp_path, eval_batches=eval_windows(1), progress=False)
    lines = (tmp_path / "metrics.jsonl").read_text()
    ckpt_mtime = (tmp_path / "checkpoint" / "trainer_state.json").stat().st_mtime_ns
    sampler, model = TinySampler(fail_at=1), tiny_model(seed=1)  # any draw would raise
    again = train(model, sampler, c, tmp_path, eval_batches=eval_windows(1), progress=False)
    assert again == first and "val_loss" in again
    assert (tmp_path / "metrics.jsonl").read_text() == lines
    assert (tmp_path / "checkpoint" / "trainer_state.json").stat().st_mtime_ns == ckpt_mtime
    assert evaluate(model, eval_windows(1)) == pytest.approx(first["val_loss"], abs=1e-6)  # final weights loaded


def test_checkpoint_is_pickle_free_atomic_and_restorable(tmp_path):
    c = cfg(steps=2, optimizer="muon")
    model, sampler = tiny_model(), TinySampler()
    train(model, sampler, c, tmp_path, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint", "metrics.jsonl", "train_config.json"]
    files = sorted(p.name for p in (tmp_path / "checkpoint").iterdir())
    assert all(f.endswith((".json", ".safetensors")) for f in files) and "model.safetensors" in files
    assert find_checkpoint(tmp_path) == tmp_path / "checkpoint"

    fresh, fresh_sampler = tiny_model(seed=3), TinySampler(seed=3)
    opt = build_optimizer(fresh, c)
    meta = load_checkpoint(tmp_path / "checkpoint", fresh, opt, fresh_sampler)
    assert meta["step"] == 2 and meta["config"]["optimizer"] == "muon"
    for (n, a), (_, b) in zip(model.named_parameters(), fresh.named_parameters()):
        assert torch.equal(a, b), n
    assert torch.equal(fresh_sampler.sample(4), sampler.sample(4))
    bufs = [s["momentum_buffer"] for s in opt.optimizers[0].state.values()]
    assert bufs and all(b.abs().sum() > 0 for b in bufs)

    (tmp_path / "checkpoint").rename(tmp_path / "checkpoint.old")  # a swap interrupted between its two renames
    assert find_checkpoint(tmp_path) == tmp_path / "checkpoint.old"


def test_snapshots_keep_the_model_along_training_and_survive_a_resume(tmp_path):
    from transformers import AutoModelForCausalLM

    from probe.runs import snapshot_steps

    init = {n: p.detach().clone() for n, p in tiny_model().named_parameters()}
    model = tiny_model()
    with pytest.raises(KeyboardInterrupt):  # dies drawing step 5's batch: checkpoint at 3, snapshots 0, 2, 4
        train(model, TinySampler(fail_at=5), cfg(snapshot_every=2), tmp_path, progress=False)
    assert list(snapshot_steps(tmp_path)) == [0, 2, 4]
    train(model, TinySampler(), cfg(snapshot_every=2), tmp_path, progress=False)  # resumes at 3, redoes step 4
    snaps = snapshot_steps(tmp_path)
    assert list(snaps) == [0, 2, 4, 6] and not [p for p in (tmp_path / "snapshots").iterdir() if p.name[0] == "."]
    loaded = {s: dict(AutoModelForCausalLM.from_pretrained(d).named_parameters()) for s, d in snaps.items()}
    assert all(torch.equal(loaded[0][n], p) for n, p in init.items())  # step 0 = the initial weights
    assert all(torch.equal(loaded[6][n], p) for n, p in model.named_parameters())  # the last = the final weights
    assert not all(torch.equal(loaded[2][n], loaded[4][n]) for n in init)

    whole = tmp_path / "whole"  # an uninterrupted run snapshots the same weights at step 4
    train(tiny_model(), TinySampler(), cfg(snapshot_every=2), whole, progress=False)
    again = dict(AutoModelForCausalLM.from_pretrained(snapshot_steps(whole)[4]).named_parameters())
    assert all(torch.equal(again[n], loaded[4][n]) for n in init)


def test_short_runs_cap_warmup_and_log_often():
    from probe.train.trainer import capped_warmup, log_interval

    assert capped_warmup(100, 30) == 3 and capped_warmup(100, 5) == 0 and capped_warmup(10, 30) == 10
    assert log_interval(10, 30) == 1 and log_interval(10, 200) == 4 and log_interval(10, 10_000) == 10


def test_warmup_not_shorter_than_the_run_warns_and_is_capped(tmp_path):
    with pytest.warns(UserWarning, match="warmup 10 >= steps 4"):
        train(tiny_model(), TinySampler(), cfg(steps=4, warmup=10, lr=1e-2), tmp_path, progress=False)
    lrs = [r["lr"] for r in read_metrics(tmp_path)]
    assert lrs[0] == pytest.approx(1e-2)  # capped to 0 warmup steps: the peak at once, not 1/10 of it


def test_resume_false_starts_over(tmp_path):
    train(tiny_model(), TinySampler(), cfg(steps=3), tmp_path, progress=False)
    train(tiny_model(), TinySampler(), cfg(steps=2), tmp_path, resume=False, progress=False)
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]


def test_evaluate_is_the_mean_next_token_loss():
    model, ev = hf_model(), eval_windows(n=3, b=2)
    hf = [model(w[:, :-1], labels=w[:, :-1]).loss for w in ev]  # HF shifts internally: scores positions 1..ctx-1
    mine = evaluate(model, ev)
    manual = torch.stack([lm_loss(model(w[:, :-1]).logits, w[:, 1:])[0] for w in ev]).mean().item()
    assert mine == pytest.approx(manual, rel=1e-6)
    assert abs(mine - torch.stack(hf).mean().item()) < 0.05  # same model, one position fewer per row
    first = lm_loss(model(ev[0][:, :-1]).logits, ev[0][:, 1:])[0].item()
    assert evaluate(model, ev, max_batches=1) == pytest.approx(first, rel=1e-6)


def test_evaluate_accepts_eval_batches_and_sampler_seed_is_checked(tmp_path):
    model, ev = hf_model(), eval_windows(n=2, b=2)
    fixed = EvalBatches(ev, torch.zeros(2, 2, dtype=torch.long), "custom-tokens", "none", 0, CTX)
    assert evaluate(model, fixed) == evaluate(model, ev) == evaluate(model, list(ev))
    with pytest.warns(UserWarning, match="paired runs"):
        train(model, TinySampler(seed=1), cfg(steps=1, seed=0), tmp_path, progress=False)


def test_paired_variants_keep_their_initial_weights_and_see_the_same_batches(tmp_path):
    """Paired seeds: the loop never re-initialises (lr = 0 leaves every weight as created: tensors the two variants
    share stay equal) and two variants with one seed draw identical batches in the same order."""
    records, models = [[], []], [tiny_model(seed=5), tiny_model(seed=5, variant="sink+proj")]
    initial = [{n: p.detach().clone() for n, p in m.named_parameters()} for m in models]
    shared = set(initial[0]) & set(initial[1])
    assert shared and all(torch.equal(initial[0][n], initial[1][n]) for n in shared)
    for i, model in enumerate(models):
        c = cfg(steps=2, lr=0.0, muon_lr=0.0, seed=5, optimizer=["adamw", "muon"][i])
        train(model, TinySampler(seed=5, record=records[i]), c, tmp_path / str(i), progress=False)
        assert all(torch.equal(p, initial[i][n]) for n, p in model.named_parameters())
    assert len(records[0]) == 2 and all(torch.equal(a, b) for a, b in zip(*records))


def test_probe_model_roles_reach_the_optimizer():
    m = tiny_model(variant="sink+proj")
    groups = _names(param_groups(m, "adamw"))
    gate_w = {n for n, p in m.named_parameters() if n.endswith("attn.gate.w")}
    sinks = {n for n in groups["no_decay"] if n.endswith("attn.sink")}
    assert gate_w and sinks and gate_w <= groups["no_decay"]  # 2-D, yet not decayed: excluded by role
    assert groups["no_decay"] == set(m.no_weight_decay()) | {n for n, p in m.named_parameters() if p.ndim < 2}
    assert "embed.weight" in groups["decay"] and "blocks.0.attn.o_proj.weight" in groups["decay"]
    muon = _names(param_groups(m, "muon"))["muon"]
    assert "blocks.0.attn.o_proj.weight" in muon and not muon & (gate_w | {"embed.weight"})


def test_read_metrics_and_training_curves_of_paired_runs(tmp_path):
    """read_metrics gives the logged rows as a DataFrame; training_figure overlays runs: one trace per run and panel,
    carrying exactly the logged values (validation loss only where an evaluation ran)."""
    from probe.present.training import training_figure
    from probe.train import read_metrics as metrics_frame

    frames = {}
    for variant in ("baseline", "sink+proj"):
        train(
            tiny_model(variant=variant),
            TinySampler(),
            cfg(steps=4, eval_every=2),
            tmp_path / variant,
            eval_batches=eval_windows(1),
            progress=False,
        )
        frames[variant] = metrics_frame(tmp_path / variant)
    df = frames["baseline"]
    assert df["step"].tolist() == [0, 1, 2, 3, 4]
    assert df["val_loss"].notna().tolist() == [True, False, True, False, True]
    assert df["loss"].dropna().tolist() == [r["loss"] for r in read_metrics(tmp_path / "baseline") if "loss" in r]
    fig = training_figure(frames)
    assert len(fig.data) == 2 * 4  # per run: training and validation loss on one axis, lr, gradient norm
    val = [t for t in fig.data if t.name == "sink+proj validation"][0]
    train_curve = [t for t in fig.data if t.name == "sink+proj training"][0]
    assert val.yaxis == train_curve.yaxis == "y" and fig.layout.yaxis.title.text.startswith("loss")
    assert list(val.x) == [0, 2, 4] and list(val.y) == frames["sink+proj"]["val_loss"].dropna().tolist()
    assert metrics_frame(tmp_path / "nothing").empty


@pytest.mark.parametrize("variant", ["sink+proj", "gatedv"])
def test_bf16_autocast_keeps_gates_and_sinks_in_fp32(variant, tmp_path):
    """Under bf16 autocast (the trainer's amp on GPU; 'bf16' forces it here) the projections run in bf16 while sink
    logits and value gates stay fp32, and training with amp='bf16' keeps a finite loss."""
    model = tiny_model(variant=variant)
    ids = CORPUS[: 2 * CTX].view(2, CTX)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, cache = model.run_with_cache(ids, names_filter=lambda n: n.startswith("blocks.0.attn."))
    assert cache["blocks.0.attn.hook_q"].dtype == torch.bfloat16
    assert cache["blocks.0.attn.hook_v_gate"].dtype == torch.float32
    if variant == "sink+proj":
        assert cache["blocks.0.attn.hook_sink_logit"].dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in model.parameters())
    last = train(model, TinySampler(), cfg(steps=2, amp="bf16", ckpt_every=0), tmp_path, progress=False)
    assert math.isfinite(last["loss"])


def test_a_run_folder_removed_under_a_checkpoint_is_a_write_error_naming_it(tmp_path, monkeypatch):
    """`probe train --out A/B/run` with A removed mid-run ended in a safetensors I/O traceback."""
    import shutil

    import probe.train.checkpoint as checkpoint
    from probe.writes import WriteError

    out, real = tmp_path / "A" / "B" / "run", checkpoint.save_file

    def vanish_then_save(tensors, filename):
        shutil.rmtree(tmp_path / "A")
        real(tensors, filename)

    monkeypatch.setattr(checkpoint, "save_file", vanish_then_save)
    with pytest.raises(WriteError, match=f"cannot write {out / 'checkpoint'}: "):
        train(tiny_model(), TinySampler(), cfg(steps=2), out, progress=False)
    assert not (tmp_path / "A").exists() or not list((tmp_path / "A").rglob(".probe-tmp-*"))


def test_a_finished_run_without_its_last_snapshot_gets_it_on_resume(tmp_path):
    """A run killed between its final checkpoint and its final snapshot (the order before snapshots came
    first) resumed to nothing and stayed without it. The trainer now writes the snapshot first, and a resume rebuilds
    a missing one from the checkpoint's weights and removes what the killed run staged: the folder then holds what an
    uninterrupted run leaves, byte for byte."""
    import shutil

    from probe.runs import snapshot_steps
    from probe.writes import TEMP_PREFIX

    whole = tmp_path / "whole"
    train(tiny_model(), TinySampler(), cfg(snapshot_every=2), whole, progress=False)
    killed = tmp_path / "killed"
    shutil.copytree(whole, killed)
    last = max(snapshot_steps(killed))
    shutil.rmtree(snapshot_steps(killed)[last])  # the final snapshot never written
    (killed / "snapshots" / f"{TEMP_PREFIX}step{last}.x").mkdir()  # ... but staged
    (killed / f"{TEMP_PREFIX}checkpoint.y").write_text("half")
    train(tiny_model(), TinySampler(), cfg(snapshot_every=2), killed, progress=False)
    assert list(snapshot_steps(killed)) == list(snapshot_steps(whole))

    def files(root):
        return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}

    got, want = files(killed), files(whole)
    assert got.keys() == want.keys()
    snap = snapshot_steps(whole)[last].relative_to(whole)
    for path in (p for p in want if snap in p.parents):  # the rebuilt snapshot: the same bytes
        assert got[path] == want[path], path


def test_a_cpu_run_keeps_freed_memory_for_reuse(tmp_path, monkeypatch):
    """On CPU the run keeps freed memory in the process (probe.kernels.heap; its effect: tests/kernels/test_heap.py)."""
    import probe.train.trainer as trainer

    calls = []
    monkeypatch.setattr(trainer, "keep_freed_memory", lambda: calls.append(1) or True)
    train(tiny_model(), TinySampler(), cfg(steps=1, ckpt_every=0, device="cpu"), tmp_path / "run", progress=False)
    assert calls == [1]


def test_flush_denormal_flushes_for_the_process_and_trains_the_same(tmp_path):
    """--flush-denormal: after the run a denormal float reads as 0 (the process's mode, as documented: on torch's
    intra-op threads too, tests/kernels/test_denormals.py), and the tiny run's losses are those of the run without it
    (nothing this model computes is that small)."""
    tiny = torch.tensor(1e-39)  # below fp32's smallest normal, 1.18e-38
    assert (tiny * 1.0).item() != 0.0
    plain = train(tiny_model(), TinySampler(), cfg(steps=3, ckpt_every=0), tmp_path / "plain", progress=False)
    try:
        flushed = train(
            tiny_model(),
            TinySampler(),
            cfg(steps=3, ckpt_every=0, flush_denormal=True),
            tmp_path / "ftz",
            progress=False,
        )
        assert (tiny * 1.0).item() == 0.0
    finally:
        set_flush_denormal(False)  # on every thread, as the run set it
    assert (tiny * 1.0).item() != 0.0
    assert flushed["loss"] == plain["loss"]
