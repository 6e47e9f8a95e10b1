"""Outlier features, the kurtosis of neuron activation RMS (docs/definitions.md#outlier-kurtosis): the streamed
analysis against a by-hand computation on a tiny model's residual streams, the values the definition implies (1 for
neurons of equal RMS, more with one outlier neuron), its jackknife standard error, and the `probe sinks --entropy
--kurtosis` command end to end."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from probe.analyses.kurtosis import activation_kurtosis, kurtosis_of_rms, neuron_rms, outlier_kurtosis
from probe.analyses.sink_pass import sink_analyses
from probe.hooks import names
from tests.support.analyses import tiny, windows
from tests.support.cli import WINDOWS, probe


@torch.no_grad()
def by_hand(model, tokens):
    """Per layer Kurt = mean_i s_i^4 / (mean_i s_i^2)^2 with s_i the RMS of neuron i over every token of every window,
    from whole resid_post tensors concatenated over batches (plain torch, float64)."""
    L = model.probe_info.n_layers
    wanted = {names.resid(l, "post") for l in range(L)}
    got = {n: [] for n in wanted}
    for ids in tokens[..., :-1]:
        _, cache = model.run_with_cache(ids, names_filter=lambda n: n in wanted)
        for n in wanted:
            got[n].append(cache[n].double().flatten(0, 1))
    out = []
    for l in range(L):
        x = torch.cat(got[names.resid(l, "post")])  # (N, d)
        s = torch.sqrt((x**2).mean(0))
        out.append(float((s**4).mean() / (s**2).mean() ** 2))
    return out


@pytest.mark.parametrize("variant", ["baseline", "sinklogit"])
def test_streamed_kurtosis_equals_the_by_hand_computation(variant):
    model, w = tiny(variant), windows(3, 2, 10)
    layers = outlier_kurtosis(model, w)["layers"]
    assert layers["hook"].tolist() == [names.resid(l, "post") for l in range(model.probe_info.n_layers)]
    assert layers["kurtosis"].tolist() == pytest.approx(by_hand(model, w), abs=1e-5)
    assert (layers["kurtosis"] >= 1 - 1e-12).all()


def test_equal_rms_neurons_give_one_and_an_outlier_neuron_raises_it():
    assert kurtosis_of_rms(torch.full((64,), 0.7)) == pytest.approx(1.0, abs=1e-15)  # a constant s: exactly 1
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200_000, 16, generator=g, dtype=torch.float64)  # i.i.d. N(0, 1): every s_i near 1
    k = activation_kurtosis(x)
    assert k == pytest.approx(1.0, abs=1e-3) and k >= 1.0
    y = x.clone()
    y[:, 5] *= 20  # one outlier neuron
    d, r = 16, 20.0
    want = ((d - 1) + r**4) / d / (((d - 1) + r**2) / d) ** 2  # the definition with s = (1, ..., 1, 20)
    assert activation_kurtosis(y) == pytest.approx(want, rel=1e-2)
    assert activation_kurtosis(y) > 5 * k
    s = neuron_rms(y)
    assert int(s.argmax()) == 5 and float(s[5]) == pytest.approx(20, rel=1e-2)


def test_jackknife_standard_error_and_per_batch_values():
    model, w = tiny("baseline"), windows(4, 2, 8)
    r = outlier_kurtosis(model, w)
    batches, layers = r["batches"], r["layers"]
    assert sorted(batches["batch"].unique()) == [0, 1, 2, 3]
    for l in range(model.probe_info.n_layers):
        loo = [by_hand(model, torch.cat([w[:i], w[i + 1 :]]))[l] for i in range(4)]
        se = math.sqrt(3 / 4 * sum((v - np.mean(loo)) ** 2 for v in loo))
        assert layers.loc[layers["layer"] == l, "kurtosis_se"].iloc[0] == pytest.approx(se, abs=1e-6)
        one = by_hand(model, w[1:2])[l]
        assert batches[(batches["batch"] == 1) & (batches["layer"] == l)]["kurtosis"].iloc[0] == pytest.approx(
            one, abs=1e-6
        )
    s = r["summary"].iloc[0]
    assert s["kurtosis"] == pytest.approx(layers["kurtosis"].mean(), abs=1e-12)
    assert s["max_layer"] == int(layers["kurtosis"].idxmax()) and s["n_tokens"] == 4 * 2 * 8


def test_kurtosis_in_the_shared_pass_equals_alone():
    model, w = tiny("baseline"), windows(2, 2, 10)
    both = sink_analyses(model, w, kurtosis=True)
    alone = outlier_kurtosis(model, w)
    for k in ("layers", "summary", "batches"):
        pd.testing.assert_frame_equal(both["kurtosis"][k], alone[k])


def test_sinks_entropy_and_kurtosis_write_their_csvs(tmp_path):
    out = tmp_path / "ek"
    r = probe("sinks", "--model", "probe/tiny-baseline", *WINDOWS, "--entropy", "--kurtosis", "--out", out)
    assert r.returncode == 0, r.stderr
    assert "attention entropy per layer" in r.stdout and "outlier features per layer" in r.stdout
    for name in ("entropy_summary", "entropy_layers", "entropy_heads", "entropy_batches"):
        assert (out / f"sinks_{name}.csv").is_file(), name
    for name in ("kurtosis_summary", "kurtosis_layers", "kurtosis_batches"):
        assert (out / f"sinks_{name}.csv").is_file(), name
    layers = pd.read_csv(out / "sinks_entropy_layers.csv")
    assert len(layers) == 6 and ((layers["entropy_norm"] > 0) & (layers["entropy_norm"] <= 1)).all()
    kurt = pd.read_csv(out / "sinks_kurtosis_layers.csv")
    assert len(kurt) == 6 and (kurt["kurtosis"] >= 1).all()
    doc = json.loads((out / "sinks.json").read_text())
    assert {"entropy_heads", "kurtosis_layers"} <= set(doc["tables"])


def test_entropy_and_kurtosis_take_one_context():
    r = probe(
        "sinks",
        "--model",
        "probe/tiny-baseline",
        "--batches",
        "1",
        "--batch-size",
        "1",
        "--ctx",
        "8",
        "16",
        "--entropy",
    )
    assert r.returncode == 2 and "--entropy takes one --ctx" in r.stderr
