"""The pretrained-model recipes (Wang 2026 Tables 13 and 14): layouts, agreement with the analyses they
wrap on the same windows, resume, and one-line user errors. Tiny models only: two zoo models and a tiny random
gpt-oss checkpoint (learned sinks, sliding and full layers)."""

from __future__ import annotations

import json
import random

import numpy as np
import pandas as pd
import pytest

from probe import experiments
from probe.analyses.inject import inject
from probe.analyses.sinks import sink_stats
from probe.checkpoints.tiny import build_tiny
from probe.experiments import pretrained, pretrained_injection, pretrained_sinks
from probe.experiments.command import build_parser, main

ZOO = ("probe/tiny-baseline", "probe/tiny-sink+proj")
WINDOWS = dict(batches=1, batch_size=2, ctx=16)


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory) -> str:
    return str(build_tiny("gpt_oss", tmp_path_factory.mktemp("gpt_oss")))


@pytest.fixture(scope="module")
def words(tmp_path_factory) -> str:
    """A small corpus of the tiny tokenizer's words (w2 ... w95), so the gpt-oss model sees varied tokens."""
    rng = random.Random(0)
    docs = [" ".join(f"w{rng.randrange(2, 96)}" for _ in range(60)) for _ in range(6)]
    path = tmp_path_factory.mktemp("corpus") / "words.txt"
    path.write_text("\n\n".join(docs) + "\n")
    return str(path)


# ------------------------------------------------------------------------------------------------ Table 14
@pytest.fixture(scope="module")
def sinks(gpt_oss, words):
    return experiments.run("pretrained-sinks", models=(ZOO[0], gpt_oss), data=words, **WINDOWS)


def test_sinks_table_has_one_row_per_model_and_layer_type(sinks, gpt_oss):
    t = sinks["table14"]
    assert list(t.columns) == [
        "model",
        "layer_type",
        "n_layers",
        "pos0_pct",
        "phantom_pct",
        "r0",
        "sink_logit_mean",
        "uniform_ref_pct",
        "pos0_over_uniform",
    ]
    assert t[t.model == ZOO[0]]["layer_type"].tolist() == ["all"]  # full attention only
    assert t[t.model == gpt_oss]["layer_type"].tolist() == ["all", "full", "sliding", "sliding (key 0 in window)"]
    baseline, oss = t[t.model == ZOO[0]].iloc[0], t[t.model == gpt_oss].set_index("layer_type")
    assert baseline.phantom_pct == 0 and np.isnan(baseline.sink_logit_mean)  # no sink logit: blank
    assert oss["sink_logit_mean"].notna().all() and (oss["phantom_pct"] > 0).all()
    layers = sinks["layers"]
    assert layers.groupby("model", sort=False).size().tolist() == [6, 2]
    sliding = layers[layers.layer_type == "sliding"]
    assert sliding["pos0_key0_pct"].notna().all() and layers[layers.layer_type == "full"]["pos0_key0_pct"].isna().all()
    assert set(sinks.figures) == {"layers"} and sinks.meta["models"] == 2


def test_sinks_numbers_are_sink_stats_by_type_on_the_same_windows(sinks, gpt_oss, words):
    cfg = pretrained_sinks.PretrainedSinksConfig(models=(gpt_oss,), data=words, **WINDOWS)
    model = pretrained.load_one(gpt_oss, cfg, progress=False)
    by_type = sink_stats(model, pretrained.windows_of(model, cfg))["by_type"]
    ours = sinks["table14"][sinks["table14"].model == gpt_oss]
    assert ours["layer_type"].tolist() == by_type["layers"].tolist()
    for pct, share in (
        ("pos0_pct", "pos0_share"),
        ("phantom_pct", "phantom_share"),
        ("uniform_ref_pct", "uniform_ref"),
    ):
        np.testing.assert_allclose(ours[pct].to_numpy(), 100 * by_type[share].to_numpy(), rtol=1e-12)
    np.testing.assert_allclose(ours["r0"].to_numpy(), by_type["r0"].to_numpy(), rtol=1e-12)
    # the sink logit of a layer type is the mean over that type's layers of their head means
    layers = sinks["layers"][sinks["layers"].model == gpt_oss]
    sliding = [i for i, t in enumerate(model.probe_info.layer_types) if t == "sliding"]
    assert ours.set_index("layer_type").loc["sliding", "sink_logit_mean"] == pytest.approx(
        layers.set_index("layer").loc[sliding, "sink_logit"].mean()
    )


# ------------------------------------------------------------------------------------------------ Table 13
DOSES = (0.2, 0.8)


@pytest.fixture(scope="module")
def injection():
    return experiments.run("pretrained-injection", models=ZOO, doses=DOSES, **WINDOWS)


def test_injection_table_layout_and_ratio(injection):
    t = injection["table13"]
    assert list(t.columns) == ["model", "cutoff", "junk", "loss_clean", "eps=0.2", "eps=0.8"]
    assert len(t) == 2 * 2 * 3 and not t.duplicated(["model", "junk", "cutoff"]).any()
    assert set(t.junk) == {"structured", "same-context", "gaussian"} and set(t.cutoff) == {"q25", "median"}
    r = injection["ratio"]
    assert len(r) == 2 * 2 and list(r.columns) == ["model", "cutoff", "ratio", "eps=0.2", "eps=0.8"]
    for row in r.itertuples():
        cell = t[(t.model == row.model) & (t.cutoff == row.cutoff)].set_index("junk")
        for col in ("eps=0.2", "eps=0.8"):
            assert r.loc[row.Index, col] == pytest.approx(cell.loc["structured", col] / cell.loc["gaussian", col])
    assert len(injection["injection"]) == 2 * 2 * 3 * len(DOSES)  # long form
    assert len(injection["exposure"]) == 2 * 2 and set(injection.figures) == {"delta_vs_dose"}


def test_injection_numbers_are_inject_on_the_same_windows(injection):
    cfg = pretrained_injection.PretrainedInjectionConfig(models=ZOO[1:], doses=DOSES, **WINDOWS)
    model = pretrained.load_one(ZOO[1], cfg, progress=False)
    direct = inject(
        model,
        pretrained.windows_of(model, cfg),
        junk=list(cfg.junk),
        cutoffs=list(cfg.cutoffs),
        doses=list(DOSES),
        progress=False,
    )["results"]
    ours = injection["injection"][injection["injection"].model == ZOO[1]]
    np.testing.assert_allclose(ours["delta"].to_numpy(), direct["delta"].to_numpy(), rtol=1e-12)
    wide = injection["table13"].set_index(["model", "cutoff", "junk"])
    for d in direct.itertuples():
        assert wide.loc[(ZOO[1], d.cutoff, d.junk), f"eps={d.dose:g}"] == pytest.approx(d.delta, rel=1e-12)


# ------------------------------------------------------------------------------------------------ resume
def _refuse(*args, **kwargs):
    raise AssertionError("a finished model was recomputed")


def test_sinks_resume_recomputes_nothing(tmp_path, monkeypatch, gpt_oss, words):
    out = tmp_path / "sinks"
    first = experiments.run("pretrained-sinks", out, models=(ZOO[0],), data=words, **WINDOWS)
    assert len(list((out / "models").glob("*.json"))) == 1
    calls = []
    real = pretrained_sinks.sink_stats
    monkeypatch.setattr(pretrained_sinks, "sink_stats", lambda *a, **k: calls.append(1) or real(*a, **k))
    second = experiments.run("pretrained-sinks", out, models=(ZOO[0], gpt_oss), data=words, **WINDOWS)
    assert len(calls) == 1  # only the new model
    pd.testing.assert_frame_equal(second["table14"][second["table14"].model == ZOO[0]], first["table14"])
    monkeypatch.setattr(pretrained_sinks, "sink_stats", _refuse)
    third = experiments.run("pretrained-sinks", out, models=(ZOO[0], gpt_oss), data=words, **WINDOWS)
    pd.testing.assert_frame_equal(third["table14"], second["table14"])
    pd.testing.assert_frame_equal(third["layers"], second["layers"])
    assert json.loads((out / "config.json").read_text())["recipe"] == "pretrained-sinks"
    with pytest.raises(ValueError, match="other settings.*ctx"):
        experiments.run("pretrained-sinks", out, models=(ZOO[0],), data=words, batches=1, batch_size=2, ctx=12)


def test_resume_refuses_a_changed_corpus_naming_both_fingerprints(tmp_path):
    corpus = tmp_path / "words.txt"
    rng = random.Random(1)
    corpus.write_text("\n\n".join(" ".join(f"w{rng.randrange(2, 96)}" for _ in range(60)) for _ in range(6)) + "\n")
    out = tmp_path / "sinks"
    experiments.run("pretrained-sinks", out, models=(ZOO[0],), data=str(corpus), **WINDOWS)
    assert len(list((out / "inputs").glob("*.fingerprint"))) == 1
    corpus.write_text(corpus.read_text().replace("w2 ", "w3 ", 1))
    with pytest.raises(ValueError, match=r"computed from other inputs.*sha256"):
        experiments.run("pretrained-sinks", out, models=(ZOO[0],), data=str(corpus), **WINDOWS)


def test_injection_resume_recomputes_nothing(tmp_path, monkeypatch):
    out = tmp_path / "inj"
    first = experiments.run("pretrained-injection", out, models=ZOO, doses=DOSES, **WINDOWS)
    monkeypatch.setattr(pretrained_injection, "inject", _refuse)
    second = experiments.run("pretrained-injection", out, models=ZOO, doses=DOSES, **WINDOWS)
    for k in ("table13", "ratio", "injection", "exposure"):
        pd.testing.assert_frame_equal(second[k], first[k])
    with pytest.raises(ValueError, match="holds the result of 'pretrained-injection'"):
        experiments.run("pretrained-sinks", out, models=ZOO, **WINDOWS)


# ------------------------------------------------------------------------------------------------ command line
@pytest.mark.parametrize(
    "argv, message",
    [
        (["pretrained-sinks", "--models", "probe/tiny-nope"], "no zoo checkpoint 'tiny-nope'"),
        (["pretrained-sinks", "--models", "probe/tiny-baseline", "not a name!"], "not a model name"),
        (["pretrained-injection", "--models", "someone/not-cached-anywhere"], "not in the local Hugging Face cache"),
        (["pretrained-injection", "--models", "probe/tiny-baseline", "--batch-size", "1"], "needs --batch-size >= 2"),
        (["pretrained-injection", "--models", "probe/tiny-baseline", "--junk", "noise"], "unknown junk type 'noise'"),
        (
            ["pretrained-sinks", "--models", "probe/tiny-baseline", "--data", "no-such-corpus"],
            "--data 'no-such-corpus'",
        ),
        (["pretrained-sinks", "--models", "probe/tiny-baseline", "--bos", "--ctx", "16"], "--bos: tokenizer"),
        (["pretrained-sinks"], "name at least one model"),
    ],
)
def test_user_errors_are_one_line_exit_2_and_write_nothing(tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "out"
    assert main([argv[0], "--out", str(out), "--quiet", *argv[1:]], prog="probe experiment") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"probe experiment {argv[0]}: error:") and message in err[0]
    assert not out.exists()


def test_command_line_writes_the_tables_and_takes_bos_both_ways(tmp_path, capsys):
    assert build_parser("pretrained-sinks").parse_args(["--out", "x"]).bos is None
    assert build_parser("pretrained-sinks").parse_args(["--out", "x", "--bos"]).bos is True
    assert build_parser("pretrained-injection").parse_args(["--out", "x", "--no-bos"]).bos is False
    out = tmp_path / "sinks"
    assert (
        main(
            [
                "pretrained-sinks",
                "--out",
                str(out),
                "--quiet",
                "--models",
                ZOO[0],
                "--no-bos",
                "--batches",
                "1",
                "--batch-size",
                "2",
                "--ctx",
                "16",
            ]
        )
        == 0
    )
    record = json.loads((out / "config.json").read_text())
    assert record["config"]["bos"] is False and record["config"]["models"] == [ZOO[0]]
    for name in ("table14", "layers", "heads", "summary", "models"):
        assert (out / f"{name}.csv").is_file()
    assert (out / "layers.html").is_file() and "Plotly.newPlot" in (out / "report.html").read_text()
    assert pd.read_csv(out / "models.csv")["bos"].tolist() == [False]
    assert "pretrained-injection" in experiments.RECIPES and "pretrained-sinks" in experiments.RECIPES


def test_injection_warns_of_a_dose_past_the_definition_before_loading(capsys):
    cfg = pretrained_injection.PretrainedInjectionConfig(models=("probe/tiny-nope",), doses=(0.4, 4.0))
    with pytest.raises(ValueError, match="tiny-nope"):
        pretrained_injection.run(cfg)
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("pretrained-injection: warning: dose 4 is outside the range") and "0 to 1.6" in line
