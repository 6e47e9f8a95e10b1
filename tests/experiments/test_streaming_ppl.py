"""The streaming-perplexity recipe (StreamingLLM Figure 3 / Table 2) on a tiny gemma3_text checkpoint (sliding and full
layers, rotary), end to end on a tiny budget: its tables, the methods against what they are by definition, resume and
one-line errors."""

from __future__ import annotations

import json
import math
import random

import pandas as pd
import pytest
import torch

import probe
from probe import experiments
from probe.checkpoints.tiny import build_tiny
from probe.experiments import streaming_ppl
from probe.experiments.command import main
from probe.experiments.pretrained import windows_of
from tests.support.analyses import tiny

BUDGET = dict(ctx=96, cache=12, keeps=(0, 1, 4), recompute_tokens=40, recompute_window=6, segment=32)


@pytest.fixture(scope="module")
def gemma(tmp_path_factory) -> str:
    return str(build_tiny("gemma3_text", tmp_path_factory.mktemp("gemma3_text")))


@pytest.fixture(scope="module")
def words(tmp_path_factory) -> str:
    rng = random.Random(0)
    docs = [" ".join(f"w{rng.randrange(2, 96)}" for _ in range(50)) for _ in range(8)]
    path = tmp_path_factory.mktemp("corpus") / "words.txt"
    path.write_text("\n\n".join(docs) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def result(gemma, words):
    return experiments.run("streaming-ppl", models=(gemma,), data=words, **BUDGET)


def test_the_tables_have_one_row_per_method_and_every_position(result):
    methods = result["methods"]
    assert methods["method"].tolist() == ["dense", "window", "sinks k=1", "sinks k=4", "recompute"]
    assert methods["n_targets"].tolist() == [96, 96, 96, 96, 40]
    assert methods["positions"].tolist() == ["n/a", "cache", "cache", "cache", "n/a"]
    assert (methods["wall_s"] > 0).all() and (methods["peak_mem_mb"] > 0).all()
    per = result["per_position"]
    assert per.groupby("method", sort=False).size().tolist() == [96, 96, 96, 96, 40]
    t = result["initial_tokens"]
    assert t["cache"].tolist() == ["0+12", "1+11", "4+8"]  # k + w held at the cache size
    seg = result["segments"]
    assert seg[seg.method == "dense"][["start", "stop", "n_targets"]].values.tolist() == [
        [0, 32, 32],
        [32, 64, 32],
        [64, 96, 32],
    ]


def test_perplexities_are_those_of_the_per_position_losses(result):
    """Past the cache: the targets t >= the method's own k + w, --cache for dense (the windowed methods' reference)."""
    per, methods = result["per_position"], result["methods"].set_index("method")
    for method, g in per.groupby("method"):
        assert methods.loc[method, "ppl"] == pytest.approx(math.exp(g["loss"].mean()), rel=1e-6)
        late = g[g.position >= methods.loc[method, "past_cache_from"]]["loss"]
        assert methods.loc[method, "ppl_past_cache"] == pytest.approx(math.exp(late.mean()), rel=1e-6)


def test_recompute_counts_past_its_own_window_and_its_segments_end_at_its_last_target(result):
    """Re-computation scores targets 0 .. recompute_tokens-1 (40) over windows of recompute_window (6) tokens: its
    past-cache perplexity is over t >= 6 (34 targets; before: t >= --cache 12, 28 targets, 6 of them in full
    context), and its last segment holds targets 32 .. 39, labelled 32 .. 40 (before: 32 .. 64)."""
    methods = result["methods"].set_index("method")
    assert methods["past_cache_from"].tolist() == [12, 12, 12, 12, 6]  # dense: --cache; eviction: k + w; recompute: w
    per = result["per_position"].query("method == 'recompute'")
    w = BUDGET["recompute_window"]
    assert methods.loc["recompute", "ppl_past_cache"] == pytest.approx(math.exp(per[per.position >= w]["loss"].mean()))
    assert methods.loc["recompute", "ppl_past_cache"] != pytest.approx(
        math.exp(per[per.position >= BUDGET["cache"]]["loss"].mean())
    )
    seg = result["segments"]
    rows = seg[seg.method == "recompute"][["start", "stop", "n_targets"]].values.tolist()
    assert rows == [[0, 32, 32], [32, 40, 8]]
    assert seg[seg.method == "recompute"]["ppl"].iloc[-1] == pytest.approx(
        math.exp(per[per.position >= 32]["loss"].mean())
    )


def test_rows_inside_the_cache_equal_dense_and_the_stream_past_it_does_not(result):
    """A query t < cache sees every earlier key under every eviction: its loss is the dense one; later rows differ."""
    per = result["per_position"].pivot(index="position", columns="method", values="loss")
    early, late = per.index < BUDGET["cache"], per.index >= BUDGET["cache"]
    for method in ("window", "sinks k=1", "sinks k=4"):
        torch.testing.assert_close(
            torch.tensor(per.loc[early, method].values), torch.tensor(per.loc[early, "dense"].values), atol=1e-5, rtol=0
        )
        assert (per.loc[late, method] - per.loc[late, "dense"]).abs().max() > 1e-4


def test_a_cache_covering_the_stream_is_the_dense_forward(gemma, words):
    res = experiments.run(
        "streaming-ppl", models=(gemma,), data=words, **{**BUDGET, "cache": 200, "recompute_tokens": 0}
    )
    per = res["per_position"].pivot(index="position", columns="method", values="loss")
    for method in ("window", "sinks k=1", "sinks k=4"):
        torch.testing.assert_close(
            torch.tensor(per[method].values), torch.tensor(per["dense"].values), atol=1e-5, rtol=0
        )


def test_recompute_scores_each_target_by_a_forward_over_its_window_alone(gemma, words, result):
    """Target t by hand: the model on tokens max(0, t-w+1) .. t alone, its last position's loss."""
    model = probe.load(gemma)
    spec = streaming_ppl.StreamingPplConfig(models=(gemma,), data=words, **BUDGET)
    ids = windows_of(model, spec).tokens[0, :1]
    w = BUDGET["recompute_window"]
    got = result["per_position"].query("method == 'recompute'").set_index("position")["loss"]
    for t in (0, 3, w - 1, w, 17, 39):
        window = ids[:, max(0, t - w + 1) : t + 2]
        with torch.no_grad():
            logits = model(window[:, :-1]).logits[0, -1].float()
        want = torch.nn.functional.cross_entropy(logits[None], window[0, -1:]).item()
        assert got.loc[t] == pytest.approx(want, abs=1e-5), t


def test_the_cli_writes_the_tables_and_resumes(gemma, words, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["streaming-ppl", "--out", str(out), "--models", gemma, "--data", words, "--quiet"]
    argv += ["--ctx", "64", "--cache", "10", "--keeps", "0", "2", "--recompute-tokens", "12", "--recompute-window", "4"]
    assert main(argv) == 0
    first = pd.read_csv(out / "methods.csv")
    assert {"methods.csv", "initial_tokens.csv", "segments.csv", "per_position.csv", "config.json"} <= {
        p.name for p in out.iterdir()
    }
    assert (out / "streaming.html").exists() and (out / "segments.html").exists()
    assert json.loads((out / "config.json").read_text())["config"]["positions"] == "cache"
    assert main(argv) == 0  # resumed: the stored record, the same numbers
    pd.testing.assert_frame_equal(pd.read_csv(out / "methods.csv").drop(columns="wall_s"), first.drop(columns="wall_s"))


@pytest.mark.parametrize(
    "options,message",
    [
        (dict(positions="text"), "--positions 'text': choose one of original, cache"),
        (dict(keeps=(0, 12)), "every --keeps value 0..cache-1"),
        (dict(batch_size=2), "one stream per model"),
        (dict(recompute_window=0), "--recompute-window 0 must be at least 1"),
    ],
)
def test_bad_options_are_one_line(gemma, words, options, message):
    with pytest.raises(ValueError, match=message):
        experiments.run("streaming-ppl", models=(gemma,), data=words, **{**BUDGET, **options})


def test_models_without_rotary_are_refused_at_cache_positions(words, tmp_path):
    tiny("baseline", pos="learned", vocab_size=8192).save_pretrained(tmp_path / "learned")
    with pytest.raises(ValueError, match="no rotary position embedding in layer 0"):
        experiments.run("streaming-ppl", models=(str(tmp_path / "learned"),), data=words, **{**BUDGET, "ctx": 32})


def test_past_context_streams_a_rotary_model_past_its_maximum_context(words, tmp_path):
    """A probe model of n_ctx 32 on a stream of 80: refused without --past-context; with it, dense runs past its
    context (ppl_past_context over the targets t >= 32) and eviction still equals dense inside the cache."""
    tiny("baseline", n_ctx=32, vocab_size=8192).save_pretrained(tmp_path / "short")
    name = str(tmp_path / "short")
    options = {**BUDGET, "ctx": 80, "recompute_tokens": 0}
    with pytest.raises(ValueError, match="--ctx 80 exceeds the maximum context 32"):
        experiments.run("streaming-ppl", models=(name,), data=words, **options)
    res = experiments.run("streaming-ppl", models=(name,), data=words, past_context=True, **options)
    methods, per = res["methods"].set_index("method"), res["per_position"]
    assert methods["n_targets"].tolist() == [80, 80, 80, 80, 76]  # the newline control scores from position 4
    seg = res["segments"].set_index("method")[["start", "stop", "n_targets"]]
    assert seg.loc["dense"].values.tolist() == [[0, 32, 32], [32, 64, 32], [64, 80, 16]]  # the stream ends at 80
    assert seg.loc["newline k=4"].values.tolist() == [[4, 32, 28], [32, 64, 32], [64, 80, 16]]
    for method, g in per.groupby("method"):
        assert methods.loc[method, "ppl_past_context"] == pytest.approx(math.exp(g[g.position >= 32]["loss"].mean()))
    assert res.meta["models"][name]["n_ctx"] == 32
    wide = per.pivot(index="position", columns="method", values="loss")
    early = wide.index < BUDGET["cache"]
    kept, dense = wide.loc[early, "sinks k=4"].values, wide.loc[early, "dense"].values
    torch.testing.assert_close(torch.tensor(kept), torch.tensor(dense), atol=1e-5, rtol=0)


def test_past_context_refuses_positions_that_stop_at_the_maximum_context(words, tmp_path):
    tiny("baseline", pos="learned", n_ctx=32, vocab_size=8192).save_pretrained(tmp_path / "learned")
    with pytest.raises(ValueError, match="--past-context: model .* cannot run past its maximum context 32"):
        experiments.run(
            "streaming-ppl",
            models=(str(tmp_path / "learned"),),
            data=words,
            past_context=True,
            positions="original",
            **{**BUDGET, "ctx": 48, "recompute_tokens": 0},
        )


def test_past_context_needs_ctx(words, gemma):
    with pytest.raises(ValueError, match="--past-context needs --ctx"):
        experiments.run("streaming-ppl", models=(gemma,), data=words, past_context=True, **{**BUDGET, "ctx": None})


def test_stream_losses_keep_no_autograd_graph(gemma, words):
    """The loss is unembedded under no_grad too: a graph would keep every chunk's logits (T x vocab) alive."""
    model = probe.load(gemma)
    ids = windows_of(model, streaming_ppl.StreamingPplConfig(models=(gemma,), data=words, **BUDGET)).tokens[0, :1]
    assert not streaming_ppl.stream_losses(model, ids).requires_grad
