"""The sink analyses on chunked attention (Llama 4's ``attention_chunk_size``, docs/definitions.md#layer-types): in a
chunked layer of chunk C only the rows t < C see key 0. On a tiny llama4_text (layer 0 chunked, layer 1 full) the
streaming sink statistics, Sink^ε and dormant heads equal references written here from the captured ``hook_pattern``
with the rows the mask lets see key 0, and the causal-uniform reference counts a row's visible keys by hand."""

from __future__ import annotations

import pytest
import torch

from probe.analyses.dormant import dormant_heads
from probe.analyses.sink_heads import sink_heads
from probe.analyses.sinks import sink_stats
from probe.checkpoints.adapters import adapt
from probe.checkpoints.tiny import tiny_model
from probe.hooks import names

N, B = 2, 2  # batches of windows
EPS = (0.1, 0.2, 0.3, 0.5)


@pytest.fixture(scope="module")
def llama4():
    """The adapted model, its chunk C (the HF config's), the windows (N, B, T+1) with T = 4 C, and each layer's
    captured pattern over every window, (N·B, H, T, T) fp64."""
    m = adapt(tiny_model("llama4_text"))
    chunk = m.hf_model.config.attention_chunk_size
    x = torch.randint(2, m.probe_info.vocab_size, (N, B, 4 * chunk + 1), generator=torch.Generator().manual_seed(1))
    patterns = {l: [] for l in range(m.probe_info.n_layers)}
    for n in range(N):
        _, cache = m.run_with_cache(x[n, :, :-1], names_filter=lambda h: names.is_attn(h, "pattern"))
        for l in patterns:
            patterns[l].append(cache[names.attn(l, "pattern")].double())
    assert m.probe_info.layer_types == ["chunked", "full"]
    assert float(torch.cat(patterns[0])[:, :, chunk:, 0].abs().max()) == 0.0  # the chunk cuts key 0 from rows t >= C
    return m, chunk, x, {l: torch.cat(p) for l, p in patterns.items()}


def key0_rows(layer_type: str, chunk: int, T: int) -> slice:
    """Rows t >= 1 that see key 0, by the mask's definition: the first chunk (t < C) or, causal, every row."""
    return slice(1, chunk if layer_type == "chunked" else T)


def uniform_share(layer_type: str, chunk: int, T: int) -> torch.Tensor:
    """(T,) key 0's share in a row uniform over its visible keys j <= t (chunked: those of t's own chunk)."""
    same = (lambda t, j: j // chunk == t // chunk) if layer_type == "chunked" else (lambda t, j: True)
    visible = [[j for j in range(t + 1) if same(t, j)] for t in range(T)]
    return torch.tensor([(0 in keys) / len(keys) for keys in visible], dtype=torch.float64)


def test_sink_statistics_equal_the_pattern_over_the_rows_that_see_key0(llama4):
    m, chunk, x, patterns = llama4
    T = x.shape[-1] - 1
    got = sink_stats(m, x)
    layers = got["layers"].set_index("layer")
    for l, kind in enumerate(m.probe_info.layer_types):
        p = patterns[l]
        share = p[..., 0] / p.sum(-1)  # (N·B, H, T) key 0's share of the real mass
        rows, uniform = key0_rows(kind, chunk, T), uniform_share(kind, chunk, T)
        row = layers.loc[l]
        assert row["pos0_share"] == pytest.approx(float(share[:, :, 1:].mean()), abs=1e-6)
        assert row["uniform_ref"] == pytest.approx(float(uniform[1:].mean()), abs=1e-12)
        if kind == "chunked":
            assert row["pos0_share_key0"] == pytest.approx(float(share[:, :, rows].mean()), abs=1e-6)
            assert row["uniform_ref_key0"] == pytest.approx(float(uniform[rows].mean()), abs=1e-12)
    by_type = got["by_type"].set_index("layers")
    assert by_type.index.tolist() == ["all", "full", "chunked", "chunked (key 0 in chunk)"]
    assert by_type.loc["chunked (key 0 in chunk)", "pos0_share"] == layers.loc[0, "pos0_share_key0"]
    assert by_type.loc["chunked (key 0 in chunk)", "uniform_ref"] == layers.loc[0, "uniform_ref_key0"]


def test_rows_past_the_first_chunk_scale_the_share_and_its_reference_alike(llama4):
    """Rows t >= C count with share 0 and reference 0, so over all rows both are their key-0-row values times the
    fraction (C - 1) / (T - 1) of rows that see key 0: the share's ratio to uniform is the same over either."""
    m, chunk, x, patterns = llama4
    T = x.shape[-1] - 1
    row = sink_stats(m, x)["layers"].set_index("layer").loc[0]
    fraction = (chunk - 1) / (T - 1)
    assert row["uniform_ref"] == pytest.approx(row["uniform_ref_key0"] * fraction, rel=1e-12)
    assert row["pos0_share"] == pytest.approx(row["pos0_share_key0"] * fraction, rel=1e-6)


def test_sink_eps_scores_and_decisions_follow_the_chunk(llama4):
    m, chunk, x, patterns = llama4
    T = x.shape[-1] - 1
    got = sink_heads(m, x, eps=EPS, window_rows="key0")
    heads, layers = got["heads"].set_index(["layer", "head"]), got["layers"]
    for l, kind in enumerate(m.probe_info.layer_types):
        key0 = patterns[l][..., 0]  # (N·B, H, T) α's rows: key 0's mass (no phantom here)
        rows, uniform = key0_rows(kind, chunk, T), uniform_share(kind, chunk, T)
        alpha = key0[:, :, rows].mean((0, 2))  # (H,) over the rows that see key 0
        for h in range(m.probe_info.n_heads):
            r = heads.loc[(l, h)]
            assert r["key0_mass"] == pytest.approx(float(key0[:, h, 1:].mean()), abs=1e-6)
            assert r["key0_mass_key0"] == pytest.approx(float(alpha[h]), abs=1e-6)
            assert r["uniform_ref"] == pytest.approx(float(uniform[1:].mean()), abs=1e-12)
            assert r["uniform_ref_key0"] == pytest.approx(float(uniform[rows].mean()), abs=1e-12)
        for e in EPS:
            lay = layers[(layers["layer"] == l) & (layers["epsilon"] == e)].iloc[0]
            assert lay["n_sink_heads"] == int((alpha > e).sum())  # window_rows='key0': decided on those rows
    assert got["summary"]["uniform_ref"].iloc[0] == pytest.approx(
        float(sum(uniform_share(k, chunk, T)[1:].mean() for k in m.probe_info.layer_types) / 2), abs=1e-12
    )


def test_dormant_heads_read_the_rows_that_see_key0(llama4):
    m, chunk, x, patterns = llama4
    T = x.shape[-1] - 1
    inputs = dormant_heads(m, x)["inputs"].set_index(["batch", "row", "layer", "head"])
    for l, kind in enumerate(m.probe_info.layer_types):
        mass = patterns[l][:, :, key0_rows(kind, chunk, T), 0].mean(-1).view(N, B, -1)  # (N, B, H)
        for (n, b, h), want in zip(torch.cartesian_prod(*map(torch.arange, mass.shape)).tolist(), mass.flatten()):
            assert inputs.loc[(n, b, l, h), "key0_mass"] == pytest.approx(float(want), abs=1e-6)
