"""Paired statistics on known numbers (docs/definitions.md#paired-differences, docs/definitions.md#document-bootstrap,
docs/definitions.md#abstention-decomposition)."""

import math

import numpy as np
import pandas as pd
import pytest

from probe.analyses.stats import abstention_decomposition, document_bootstrap, paired_differences, perplexity_summary


def long(values: dict) -> pd.DataFrame:
    return pd.DataFrame([{"variant": v, "seed": s, "loss": x} for v, xs in values.items() for s, x in enumerate(xs)])


def test_paired_differences():
    df = long({"baseline": [3.0, 3.1, 3.2], "gated": [2.9, 3.15, 3.0], "sink": [3.0, 3.0, np.nan]})
    res = paired_differences(df.dropna(), "baseline")
    s = res["summary"].set_index("variant")
    imp = np.array([0.1, -0.05, 0.2])
    assert s.loc["gated", "mean"] == pytest.approx(imp.mean())
    assert s.loc["gated", "se"] == pytest.approx(imp.std(ddof=1) / math.sqrt(3))
    assert s.loc["gated", "n_improved"] == 2 and s.loc["gated", "n"] == 3
    assert s.loc["sink", "n"] == 2 and s.loc["sink", "mean"] == pytest.approx(0.05)  # only the seeds both have
    per_seed = res["per_seed"].query("variant == 'gated'")
    assert per_seed["improvement"].tolist() == pytest.approx(imp.tolist())
    higher = paired_differences(df.dropna(), "baseline", ["gated"], lower_is_better=False)["summary"]
    assert higher["mean"].iloc[0] == pytest.approx(-imp.mean()) and higher["n_improved"].iloc[0] == 1
    with pytest.raises(ValueError, match="one row per"):
        paired_differences(pd.concat([df, df]), "baseline")


def test_perplexity_summary_is_mean_of_per_seed_perplexities():
    df = long({"a": [math.log(50), math.log(60), math.log(70)]})
    row = perplexity_summary(df).iloc[0]
    assert row["ppl_mean"] == pytest.approx(60.0) and row["ppl_sd"] == pytest.approx(10.0) and row["n"] == 3


def test_document_bootstrap_point_estimate_and_interval():
    # 2 seed pairs, 4 windows from 3 documents (document 7 has two windows), 10 tokens per window
    diffs = np.array([[1.0, 2.0, 3.0, 6.0], [3.0, 2.0, 1.0, 2.0]])
    docs = np.array([7, 7, 8, 9])
    res = document_bootstrap(diffs, docs, 10, n_resamples=2000, seed=0)
    # per document, averaged over pairs: doc 7: (3 + 5) / 2 = 4 over 20 tokens; doc 8: 2 / 10; doc 9: 4 / 10
    assert res["mean"] == pytest.approx((4 + 2 + 4) / 40)
    assert res["n_documents"] == 3 and res["n_pairs"] == 2
    assert res["lo"] <= res["mean"] <= res["hi"]
    assert res["lo"] >= 0.2 - 1e-12 and res["hi"] <= 0.4 + 1e-12  # the extremes: all doc 8 / all doc 9
    assert document_bootstrap(diffs, docs, 10, seed=0) == res  # seeded


def test_document_bootstrap_constant_differences_have_no_spread():
    res = document_bootstrap(np.full(20, 0.5), np.arange(20), 1)
    assert res["mean"] == res["lo"] == res["hi"] == pytest.approx(0.5)
    rng = np.random.default_rng(0)
    wide = document_bootstrap(rng.normal(0, 1, 200), np.arange(200), 1)
    narrow = document_bootstrap(rng.normal(0, 0.1, 200), np.arange(200), 1)
    assert (wide["hi"] - wide["lo"]) > 5 * (narrow["hi"] - narrow["lo"])
    x = rng.normal(0, 1, 200)
    assert document_bootstrap(x, np.arange(200), 1, seed=1)["lo"] != document_bootstrap(x, np.arange(200), 1)["lo"]
    # the 95% interval of a mean of 200 unit-variance documents is about ±1.96/sqrt(200) = ±0.139
    half = (document_bootstrap(x, np.arange(200), 1)["hi"] - document_bootstrap(x, np.arange(200), 1)["lo"]) / 2
    assert half == pytest.approx(1.96 * x.std() / math.sqrt(200), rel=0.15)


def test_abstention_decomposition_reproduces_table_2_arithmetic():
    # 124M norm gate row of Table 2: sink 0.0052, gate 0.0059, both 0.0087 -> overlap 0.0024, filter 0.0035, share 40%
    base = np.array([3.00, 3.01, 2.99])
    noise = np.array([0.001, -0.001, 0.0])
    df = long(
        {
            "baseline": base,
            "sinklogit": base - 0.0052 + noise,
            "normgate": base - 0.0059,
            "sink+norm": base - 0.0087 - noise,
        }
    )
    t = abstention_decomposition(df).set_index("quantity")
    assert t.loc["sink", "mean"] == pytest.approx(0.0052)
    assert t.loc["gate", "mean"] == pytest.approx(0.0059)
    assert t.loc["both", "mean"] == pytest.approx(0.0087)
    assert t.loc["overlap", "mean"] == pytest.approx(0.0024)
    assert t.loc["filter", "mean"] == pytest.approx(0.0035)
    assert t.loc["share", "mean"] == pytest.approx(0.0035 / 0.0087)
    assert t.loc["gate", "se"] == pytest.approx(0.0, abs=1e-12)
    assert t.loc["filter", "se"] == pytest.approx(np.std(2 * noise, ddof=1) / math.sqrt(3))
    no_gate = abstention_decomposition(df[df["variant"] != "normgate"]).set_index("quantity")
    assert np.isnan(no_gate.loc["gate", "mean"]) and np.isnan(no_gate.loc["overlap", "mean"])
    assert no_gate.loc["filter", "mean"] == pytest.approx(0.0035)


def test_window_losses_from_eval_batches_feed_the_document_bootstrap():
    import torch

    from probe.analyses.capture import window_losses
    from probe.analyses.sinks import sink_stats
    from probe.data import eval_batches
    from tests.support.analyses import tiny

    g = torch.Generator().manual_seed(0)
    docs = [torch.randint(0, 97, (int(n),), generator=g) for n in torch.randint(12, 30, (10,), generator=g)]
    batches = eval_batches(docs, "probe-bpe-8k", n_batches=2, batch_size=3, ctx=10, seed=5)
    a, b = tiny("baseline"), tiny("sinklogit")
    la, lb = window_losses(a, batches), window_losses(b, batches)
    assert la["doc_id"].tolist() == batches.doc_ids.flatten().tolist()
    assert (la["n_tokens"] == 10).all()
    diff = (la["loss_sum"] - lb["loss_sum"]).to_numpy()
    res = document_bootstrap(diff, la["doc_id"], la["n_tokens"], seed=0)
    assert res["mean"] == pytest.approx(diff.sum() / 60) and res["n_documents"] == 6
    assert la.attrs["meta"]["corpus"] == "custom-tokens" and la.attrs["meta"]["data_seed"] == 5
    assert sink_stats(a, batches)["meta"]["ctx"].iloc[0] == 10


def test_default_windows_use_the_models_context_and_record_the_corpus():
    from probe.analyses.inject import inject
    from probe.data.windows import default_windows
    from probe.models import create

    model = create("sinklogit", n_layers=1, d_model=32, n_heads=4, d_mlp=64, n_ctx=24)  # vocabulary 8192
    batches = default_windows(model, n_batches=1, batch_size=2)
    assert batches.tokens.shape == (1, 2, 25) and batches.tokenizer == "probe-bpe-8k"
    res = inject(model, batches, doses=[0.4], progress=False)
    meta = res["results"].attrs["meta"]
    assert meta["corpus"] == "wikitext-2-test" and meta["ctx"] == 24 and meta["corpus_fingerprint"]
