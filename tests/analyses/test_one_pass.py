"""One forward of the model per evaluation batch: `probe sinks` (sink statistics, Sink^ε, and with --massive massive
activations; with --dormant the dormant heads of the evaluation windows' own domain) and `probe report` read every
analysis from the same pass. Forwards are counted at the model's embedding hook (``hook_embed``, run once at the start
of every forward): a forward pre-hook on the root module would miss them, since TransformerLens's ``run_with_hooks``
calls ``forward`` directly. A second pass over the same windows, stopped early or not, is seen.

Dormant heads compare input domains: a domain other than the evaluation windows' is other windows, one forward per
batch of its own (counted per batch of each domain)."""

from __future__ import annotations

import contextlib
import io
from collections import Counter

import pytest
import torch

from probe.analyses.sink_pass import sink_analyses
from probe.hooks import names

WINDOWS = ["--batches", "2", "--batch-size", "2", "--ctx", "32", "--quiet"]
BATCHES = 2


@contextlib.contextmanager
def forwards():
    """Counter of forwards per model (keyed by the model's embedding hook point, held so that a model freed during
    the block cannot hand its id to the next) while the block runs."""
    seen: Counter = Counter()

    def count(module, args):
        if getattr(module, "name", None) == names.EMBED:
            seen[module] += 1

    handle = torch.nn.modules.module.register_module_forward_pre_hook(count)
    try:
        yield seen
    finally:
        handle.remove()


def run(argv, tmp_path) -> Counter:
    from probe.cli.main import main

    with forwards() as seen, contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main([*argv, "--out", str(tmp_path / "out")]) == 0
    return seen


@pytest.mark.parametrize("extra", [[], ["--massive"]], ids=["default", "massive"])
@pytest.mark.parametrize(
    "model,data", [("probe/tiny-sink+proj", []), ("probe/bb-sinklogit", ["--data", "synthetic:bb"])], ids=["text", "bb"]
)
def test_sinks_runs_one_forward_per_batch(model, data, extra, tmp_path):
    seen = run(["sinks", "--model", model, *data, *WINDOWS, *extra], tmp_path)
    assert list(seen.values()) == [BATCHES], seen
    written = {p.name for p in (tmp_path / "out").rglob("*.csv")}
    assert {"sinks_summary.csv", "sinks_sink_eps_summary.csv"} <= written, written
    if extra:
        assert "sinks_massive_layers.csv" in written, written


def test_sinks_dormant_reads_the_evaluation_domain_in_the_same_pass(tmp_path):
    # the evaluation windows (synthetic:bb) are one of the two domains: their dormant heads come from the main pass;
    # the other domain is other windows, one forward per batch of its own
    seen = run(
        [
            "sinks",
            "--model",
            "probe/bb-sinklogit",
            "--data",
            "synthetic:bb",
            *WINDOWS,
            "--massive",
            "--dormant",
            "--dormant-corpora",
            "synthetic:bb",
            "synthetic:bb[seed=1]",
        ],
        tmp_path,
    )
    assert list(seen.values()) == [BATCHES + BATCHES], seen
    seen = run(
        [
            "sinks",
            "--model",
            "probe/bb-sinklogit",
            "--data",
            "synthetic:bb",
            *WINDOWS,
            "--dormant",
            "--dormant-corpora",
            "synthetic:bb[seed=1]",
            "synthetic:bb[seed=2]",
        ],
        tmp_path / "two",
    )
    assert list(seen.values()) == [BATCHES + 2 * BATCHES], seen


def test_report_runs_one_forward_per_batch_and_model(tmp_path):
    models = ["probe/tiny-sink+proj", "probe/tiny-baseline"]
    seen = run(["report", "--models", *models, *WINDOWS], tmp_path)
    assert sorted(seen.values()) == [BATCHES] * len(models), seen


def test_the_one_pass_results_equal_each_analysis_alone():
    """Each part of the shared pass returns what its analysis's own function returns (dormant on the evaluation
    windows fused into the pass, and on other windows in a pass of their own)."""
    import probe
    from probe.analyses.dormant import dormant_heads
    from probe.analyses.massive import massive_activations
    from probe.analyses.sink_heads import sink_heads
    from probe.analyses.sinks import sink_stats

    model = probe.load("probe/tiny-sink+proj")
    gen = torch.Generator().manual_seed(0)
    w = torch.randint(0, model.probe_info.vocab_size, (2, 2, 33), generator=gen)
    other = torch.randint(0, model.probe_info.vocab_size, (1, 2, 33), generator=gen)
    domains = {"other": other, "eval": w}
    with forwards() as seen:
        together = sink_analyses(model, w, eps=[0.1, 0.3], massive=True, dormant=domains)
    assert list(seen.values()) == [len(w) + len(other)]
    alone = {
        "sinks": sink_stats(model, w),
        "sink_eps": sink_heads(model, w, eps=[0.1, 0.3]),
        "massive": massive_activations(model, w),
        "dormant": dormant_heads(model, domains),
    }
    assert sorted(together) == sorted(alone)
    for key, tables in alone.items():
        assert sorted(together[key]) == sorted(tables), key
        for name, df in tables.items():
            got = together[key][name]
            assert list(got.columns) == list(df.columns), (key, name)
            assert got.equals(df), (key, name)  # bitwise: the same row masses, summed in the same order
    assert list(together["dormant"]["summary"]["domain"]) == ["other", "eval", "all"]
