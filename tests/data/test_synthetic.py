"""Bigram-Backcopy corpus (probe.data.synthetic) and the active/dormant split (probe.analyses.backcopy)."""

import pytest
import torch

from probe.analyses.backcopy import SplitAccumulator, backcopy_split
from probe.data import BBSampler, BigramBackcopy, parse_synthetic
from probe.data.synthetic import keyed_generator
from probe.models import create
from probe.present.backcopy import backcopy_figure

TASK = BigramBackcopy(vocab=16, triggers=2, seed=3, T=64)


# ---------------------------------------------------------------- the generator's rules


def test_bos_first_and_nowhere_else():
    x = TASK.generate(50, keyed_generator("t", 0))
    assert x.shape == (50, 65) and x.dtype == torch.long
    assert (x[:, 0] == TASK.bos_id).all() and (x[:, 1:] < TASK.vocab).all() and (x[:, 1:] >= 0).all()


def test_after_a_trigger_the_token_before_it_is_copied():
    x = TASK.generate(200, keyed_generator("t", 1))
    trig = TASK.is_trigger[x[:, 1:-1]]  # positions 1..T-1 holding a trigger
    assert trig.any()
    assert torch.equal(x[:, 2:][trig], x[:, :-2][trig])  # x[t+1] == x[t-1]
    assert not TASK.is_trigger[x[:, 1]].any()  # the first drawn token is never a trigger
    assert not (TASK.is_trigger[x[:, 1:-1]] & TASK.is_trigger[x[:, 2:]]).any()  # no two triggers in a row
    assert torch.equal(TASK.after_trigger(x)[:, 2:], trig)


def test_triggers_are_the_most_frequent_tokens_of_the_chain():
    P, pi = TASK.transition, TASK.stationary
    assert P.shape == (16, 16) and torch.allclose(P.sum(1), torch.ones(16, dtype=P.dtype))
    assert torch.allclose(pi @ P, pi, atol=1e-10)
    top = set(torch.topk(pi, 2).indices.tolist())
    assert set(TASK.trigger_ids.tolist()) == top


def test_non_trigger_steps_follow_the_bigram_chain():
    task = BigramBackcopy(vocab=8, triggers=1, seed=0, T=256)
    x = task.generate(400, keyed_generator("t", 2))
    prev, nxt = x[:, 1:-1].flatten(), x[:, 2:].flatten()
    drawn = ~task.is_trigger[prev]
    counts = torch.zeros(8, 8, dtype=torch.float64)
    counts.index_put_((prev[drawn], nxt[drawn]), torch.ones(int(drawn.sum()), dtype=torch.float64), accumulate=True)
    checked = 0
    for a in range(8):
        n = counts[a].sum()
        if task.is_trigger[a] or n < 300:  # a trigger's successor is a copy; rare tokens say little
            continue
        empirical = counts[a] / n
        # a multinomial share's standard error is at most 0.5/sqrt(n): allow 5 of them
        assert (empirical - task.transition[a]).abs().max() < 5 * 0.5 / n.sqrt()
        checked += 1
    assert checked >= 5


def test_determinism_from_seed_vocab_triggers_T():
    a, b = BigramBackcopy(vocab=16, triggers=2, seed=3, T=64), TASK
    assert torch.equal(a.transition, b.transition) and a.fingerprint == b.fingerprint
    assert torch.equal(a.eval_windows(2, 3).tokens, b.eval_windows(2, 3).tokens)
    other = BigramBackcopy(vocab=16, triggers=2, seed=4, T=64)
    assert not torch.equal(other.transition, a.transition)
    assert a.to_identity()["trigger_ids"] == a.trigger_ids.tolist()
    assert BigramBackcopy.from_identity(a.to_identity()) == a
    with pytest.raises(ValueError, match="differs"):
        BigramBackcopy.from_identity({**a.to_identity(), "fingerprint": "0" * 16})


def test_eval_windows_carry_trigger_positions_and_differ_from_training():
    w = TASK.eval_windows(3, 4)
    assert w.tokens.shape == (3, 4, 65) and len(w) == 3 and w.batch_size == 4 and w.ctx == 64
    assert torch.equal(w.trigger_rows, TASK.is_trigger[w.tokens[..., :-1]])
    assert torch.equal(w.after_trigger[..., 1:], w.trigger_rows)
    meta = w.to_dict()
    assert meta["corpus"] == TASK.spec() and meta["trigger_ids"] == TASK.trigger_ids.tolist()
    train = TASK.sampler(0).sample(12)
    assert not any(torch.equal(train[i], w.tokens.view(12, 65)[i]) for i in range(12))


# ---------------------------------------------------------------- resumable sampler


def test_sampler_resumes_exactly():
    s = TASK.sampler(seed=5)
    straight = [s.sample(4) for _ in range(5)]
    r = TASK.sampler(seed=5)
    r.sample(4), r.sample(4)
    state = r.state_dict()
    resumed = BBSampler(TASK, seed=0)
    resumed.load_state_dict(state)
    assert resumed.seed == 5
    for want in straight[2:]:
        assert torch.equal(resumed.sample(4), want)
    assert not torch.equal(TASK.sampler(seed=6).sample(4), straight[0])  # another seed, other draws
    with pytest.raises(ValueError, match="same synthetic task"):
        BBSampler(BigramBackcopy(vocab=16, triggers=2, seed=3, T=32)).load_state_dict(state)


# ---------------------------------------------------------------- names


def test_parse_round_trip_and_base():
    t = parse_synthetic("synthetic:bb[vocab=32,triggers=2,seed=7,T=128]")
    assert t == BigramBackcopy(32, 2, 7, 128) and parse_synthetic(t.spec()) == t
    assert parse_synthetic("synthetic:bb") == BigramBackcopy()
    assert parse_synthetic("synthetic:bb[]") == BigramBackcopy()
    assert parse_synthetic("synthetic:bb[ T = 64 ]") == BigramBackcopy(T=64)
    assert parse_synthetic("synthetic:bb[seed=1]", base=t) == BigramBackcopy(32, 2, 1, 128)


@pytest.mark.parametrize(
    "name,message",
    [
        ("synthetic:xx", "unknown synthetic task 'xx'.*choose one of: bb"),
        ("synthetic:bb[vocab=64,heads=2]", "unknown key 'heads'.*valid keys: vocab, triggers, seed, T"),
        ("synthetic:bb[vocab=abc]", "vocab='abc'.*must be an integer"),
        ("synthetic:bb[vocab]", "'vocab'.*is not key=value"),
        ("synthetic:bb[vocab=8,vocab=9]", "given twice"),
        ("synthetic:bb[triggers=40]", r"triggers=40 is not valid; choose 1\.\.32"),
        ("synthetic:bb[T=1]", "T=1 is not valid; choose at least 2"),
        ("synthetic:bb[seed=-1]", "seed=-1 is not valid"),
        ("synthetic:bb[vocab=2]", "vocab=2 is too small"),
        ("wikitext", "not a synthetic corpus name"),
        ("synthetic:bb[T=8", "not a synthetic corpus name"),
    ],
)
def test_parse_errors_are_one_line(name, message):
    with pytest.raises(ValueError, match=message) as e:
        parse_synthetic(name)
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------- the active/dormant split


def test_split_accumulator_on_a_hand_built_pattern():
    T = 5
    trigger_rows = torch.tensor([[False, False, True, False, True]])
    pattern = torch.zeros(1, 1, T, T)
    for t in range(T):
        if trigger_rows[0, t]:
            pattern[0, 0, t, t - 1] = 0.9  # active: the previous token
            pattern[0, 0, t, 0] = 0.1
        else:
            pattern[0, 0, t, 0] = 0.6  # dormant: BOS, and the rest on the phantom
    phantom = 1 - pattern.sum(-1)
    acc = SplitAccumulator(1, 1)
    acc.add(0, pattern, phantom, trigger_rows)
    row = acc.tables()["heads"].iloc[0]
    assert row["n_trigger_rows"] == 2 and row["n_other_rows"] == 1  # rows 2, 4 vs row 3 (rows 0, 1 excluded)
    assert row["prev_at_trigger"] == pytest.approx(0.9) and row["bos_at_trigger"] == pytest.approx(0.1)
    assert row["bos_elsewhere"] == pytest.approx(0.6) and row["phantom_elsewhere"] == pytest.approx(0.4)
    assert row["prev_elsewhere"] == 0 and row["phantom_at_trigger"] == pytest.approx(0)
    assert row["uniform_at_trigger"] == pytest.approx((1 / 3 + 1 / 5) / 2)
    assert row["uniform_elsewhere"] == pytest.approx(1 / 4)
    assert row["split_score"] == pytest.approx(0.9 - 0 + 0.6 - 0.1)


@pytest.mark.parametrize("variant,sink", [("baseline", None), ("sinklogit", 1.5)])
def test_split_on_a_model_with_uniform_attention(variant, sink):
    """Zero query weights make every row uniform over its keys (and the phantom, exp(sink) against 1 per key): the
    previous token and BOS each get 1/(t+1+exp(sink)) of row t."""
    task = BigramBackcopy(vocab=16, triggers=2, seed=0, T=24)
    model = create(
        variant, "tiny", seed=0, n_layers=2, n_heads=2, d_model=32, d_mlp=64, n_ctx=24, vocab_size=task.vocab_size
    ).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("q_proj.weight"):
                p.zero_()
            if name.endswith("attn.sink"):
                p.fill_(sink)
    w = task.eval_windows(2, 3)
    res = backcopy_split(model, w)
    e = 0.0 if sink is None else torch.tensor(sink).exp().item()
    rows = w.trigger_rows.reshape(-1, 24)
    t = torch.arange(24, dtype=torch.float64).expand_as(rows)
    want_trig = float((1 / (t + 1 + e))[:, 2:][rows[:, 2:]].mean())
    want_other = float((1 / (t + 1 + e))[:, 2:][~rows[:, 2:]].mean())
    want_ph_other = float((e / (t + 1 + e))[:, 2:][~rows[:, 2:]].mean())
    heads = res["heads"]
    assert len(heads) == 4 and set(res["layers"]["layer"]) == {0, 1}
    for col, want in (
        ("prev_at_trigger", want_trig),
        ("bos_at_trigger", want_trig),
        ("bos_elsewhere", want_other),
        ("prev_elsewhere", want_other),
        ("phantom_elsewhere", want_ph_other),
    ):
        assert heads[col].tolist() == pytest.approx([want] * 4, rel=1e-4), col
    assert heads["n_trigger_rows"].iloc[0] == int(rows[:, 2:].sum())
    assert res["meta"]["corpus"].iloc[0] == task.spec()
    fig = backcopy_figure(res)
    assert len(fig.data) == 6


def test_split_needs_triggers_for_plain_windows():
    model = create(
        "baseline", "tiny", seed=0, n_layers=1, n_heads=1, d_model=16, d_mlp=32, n_ctx=8, vocab_size=17
    ).eval()
    x = torch.randint(0, 17, (1, 2, 9))
    with pytest.raises(ValueError, match="triggers="):
        backcopy_split(model, x)
    assert len(backcopy_split(model, x, triggers=[3, 4])["heads"]) == 1


# ---------------------------------------------------------------- the emergence recipe's plumbing


def test_emergence_run_trains_resumes_and_measures_every_snapshot(tmp_path):
    from probe.experiments.sink_emergence import EmergenceConfig, snapshot_table, train_variant, trajectory_figure

    cfg = EmergenceConfig(
        n_layers=2,
        n_heads=1,
        d_model=16,
        d_mlp=32,
        vocab=8,
        triggers=1,
        T=16,
        steps=4,
        batch_size=4,
        warmup=1,
        snapshot_every=2,
        n_eval_batches=2,
        eval_batch_size=2,
    )
    last = train_variant(cfg, "sinklogit", 0, tmp_path / "run")
    assert last["step"] == 4 and last["cpu_s"] >= 0
    again = train_variant(cfg, "sinklogit", 0, tmp_path / "run")  # finished: reloads, trains nothing
    assert again["step"] == 4
    t = snapshot_table(cfg, "sinklogit", 0, tmp_path / "run")
    assert sorted(t["step"].unique()) == [0, 2, 4] and sorted(t["layer"].unique()) == [0, 1]
    assert t["phantom_share"].between(0, 1).all() and t["r0"].gt(0).all()
    assert {"sink_formed", "pos0_over_uniform", "r0_later", "prev_at_trigger", "bos_elsewhere", "loss_copy"} <= set(
        t.columns
    )
    assert (tmp_path / "run" / "snapshot_stats.csv").exists()
    assert len(trajectory_figure(t).data) == 6 * 2  # six statistics (sensitivity's mixing too) x two layers, one run
