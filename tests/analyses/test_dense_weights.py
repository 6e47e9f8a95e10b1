"""Dense-connection weights (docs/definitions.md#dense-weights): `probe.analyses.sources.dense_weights` streams mean and
std over tokens of every DenseFormer / MUDD mix weight; they equal the same statistics of the whole captured
``blocks.<l>.dense.hook_weights`` (run_with_cache, float64) on tiny models and on the tiny MUDDFormer / MUDDPythia
checkpoints in the authors' format, and at MUDD's initialisation they are the plain residual."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import probe
from probe.analyses.sources import dense_weights
from probe.hooks import names
from tests.support.analyses import tiny, windows

AUTHORS = Path(__file__).resolve().parents[1] / "fixtures" / "authors"
TOL = 1e-10


def perturbed(variant: str, seed: int = 0):
    """A tiny float64 dense model whose mixes are not the residual: random static weights, and for MUDD a nonzero
    W2 (the per-token part)."""
    model = tiny(variant, seed=seed).to(torch.float64)
    g = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".dense." in name and (name.endswith("bias") or name.endswith("w2.weight")):
                p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.5)
    return model


def reference(model, tokens) -> dict[tuple[int, str, str], tuple[float, float]]:
    """{(layer, stream, source): (mean, std)} from the whole captured weights of every window at once."""
    from probe.analyses.sources import dense_source_labels, dense_stream_labels

    wanted = [n for n in model.hook_dict if names.is_dense_weights(n)]
    parts: dict[str, list[torch.Tensor]] = {}
    with torch.no_grad():
        for ids in tokens[..., :-1]:
            _, cache = model.run_with_cache(ids, names_filter=lambda n: n in wanted)
            for n in wanted:
                parts.setdefault(n, []).append(cache[n].double())
    out = {}
    for n in wanted:
        w = torch.cat(parts[n]).flatten(0, 1)  # (tokens, C, S)
        mean, std = w.mean(0), w.std(0, unbiased=False)
        streams, sources = dense_stream_labels(w.shape[1]), dense_source_labels(w.shape[2])
        for c, stream in enumerate(streams):
            for s, source in enumerate(sources):
                out[(names.layer_of(n), stream, source)] = (float(mean[c, s]), float(std[c, s]))
    return out


def check_against_reference(model, tokens) -> dict:
    res = dense_weights(model, tokens)
    ref = reference(model, tokens)
    got = {(r.layer, r.stream, r.source): (r.weight_mean, r.weight_std) for r in res["dense_weights"].itertuples()}
    assert sorted(got) == sorted(ref)
    for key, (mean, std) in ref.items():
        assert abs(got[key][0] - mean) <= TOL and abs(got[key][1] - std) <= TOL, (key, got[key], (mean, std))
    for r in res["dense_layers"].itertuples():  # the per-layer columns are sums of the per-source means
        m = [ref[(r.layer, r.stream, s)][0] for s in ["embed"] + [f"block{j}" for j in range(r.n_sources - 1)]]
        assert abs(r.latest_weight - m[-1]) <= TOL and abs(r.embed_weight - m[0]) <= TOL
        assert abs(r.earlier_weight - sum(m[1:-1])) <= TOL and abs(r.weight_sum - sum(m)) <= TOL
        assert r.n_tokens == tokens.shape[0] * tokens.shape[1] * (tokens.shape[2] - 1)
    return res


@pytest.mark.parametrize("variant, streams", [("denseformer", {"r"}), ("mudd", {"q", "k", "v", "r"})])
def test_streamed_weights_equal_the_whole_capture(variant, streams, one_thread):
    res = check_against_reference(perturbed(variant), windows(3, 2, 10))
    layers = res["dense_layers"]
    assert set(layers["stream"]) == streams
    assert layers.groupby("layer")["n_sources"].first().tolist() == [l + 2 for l in sorted(set(layers["layer"]))]
    assert float(res["summary"]["residual_distance"].iloc[0]) > 0.1  # the perturbation shows


@pytest.mark.parametrize("family", ["muddformer", "muddpythia"])
def test_streamed_weights_equal_the_whole_capture_on_the_authors_checkpoints(family, one_thread):
    model = probe.load(AUTHORS / f"{family}-checkpoint" / "checkpoint", dtype=torch.float64)
    res = check_against_reference(model, windows(2, 2, 12, vocab=model.probe_info.vocab_size))
    assert int(res["summary"]["n_layers"].iloc[0]) == model.probe_info.n_layers


def test_at_mudd_initialisation_the_weights_are_the_plain_residual(one_thread):
    res = dense_weights(tiny("mudd"), windows(2, 2, 8))  # W2 = 0, a_i one-hot on the latest state
    w = res["dense_weights"]
    latest = w["source_index"] == w.groupby(["layer", "stream"])["source_index"].transform("max")
    assert (w.loc[latest, "weight_mean"] == 1.0).all() and (w.loc[~latest, "weight_mean"] == 0.0).all()
    assert (w["weight_std"] == 0.0).all()
    s = res["summary"].iloc[0]
    assert (s["latest_weight"], s["embed_weight"], s["earlier_weight"], s["residual_distance"]) == (1.0, 0.0, 0.0, 0.0)


def test_a_model_without_dense_connections_is_refused():
    with pytest.raises(ValueError, match="no dense connections"):
        dense_weights(tiny("baseline"), windows(1, 1, 6))
