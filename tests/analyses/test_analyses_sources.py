"""Depth routing statistics (LR-AttnRes 2026 §4.5-4.7): hand-built weights with known answers, tiny routed models."""

import math

import numpy as np
import pytest
import torch

from probe.analyses.sources import SourceAccumulator, effective_sources, entropy
from tests.support.analyses import every_variant, sources_reference, tiny, windows

FULL = {"blocks.0.mlp_read": ["embed", "attn0"], "blocks.1.attn_read": ["embed", "attn0", "mlp0"]}
BLOCK = {
    "blocks.0.mlp_read": ["embed", "partial"],
    "blocks.1.attn_read": ["embed", "block1"],
    "final_read": ["embed", "block1", "partial"],
}


def test_uniform_weights_give_neff_equal_to_sources():
    acc = SourceAccumulator(FULL)
    acc.add("blocks.0.mlp_read", torch.full((2, 5, 2), 0.5))
    acc.add("blocks.1.attn_read", torch.full((2, 5, 3), 1 / 3))
    sites = acc.tables()["sites"]
    assert sites["neff_mean"].tolist() == pytest.approx([2.0, 3.0])
    assert sites["neff_std"].tolist() == pytest.approx([0.0, 0.0], abs=1e-6)
    assert sites["top1_mass"].tolist() == pytest.approx([0.5, 1 / 3])
    assert sites["input_dependence"].tolist() == pytest.approx([0.0, 0.0], abs=1e-12)


def test_one_hot_weights_give_neff_one_and_input_dependence_of_the_mixture():
    acc = SourceAccumulator(FULL)
    a = torch.zeros(4, 3)
    a[:2, 0] = 1  # half the tokens read the embedding only, half the MLP output only
    a[2:, 2] = 1
    acc.add("blocks.0.mlp_read", torch.tensor([[1.0, 0.0]]))
    acc.add("blocks.1.attn_read", a)
    t = acc.tables()
    site = t["sites"].iloc[1]
    assert site["neff_mean"] == pytest.approx(1.0)
    assert site["top1_mass"] == pytest.approx(1.0)
    assert site["input_dependence"] == pytest.approx(math.log(2))  # H(mean α) = log 2, mean H(α) = 0
    assert (site["mass_embedding"], site["mass_attention"], site["mass_mlp"]) == pytest.approx((0.5, 0.0, 0.5))
    heat = t["heatmap"].set_index("site")
    assert list(heat.columns) == ["embed", "attn0", "mlp0"]
    assert np.isnan(heat.loc["blocks.0.mlp_read", "mlp0"])  # the first site cannot read mlp0
    assert heat.loc["blocks.1.attn_read"].tolist() == pytest.approx([0.5, 0.0, 0.5])


def test_neff_std_and_entropy():
    a = torch.tensor([[0.5, 0.5], [1.0, 0.0]])
    assert entropy(a).tolist() == pytest.approx([math.log(2), 0.0])
    acc = SourceAccumulator({"s": ["embed", "attn0"]})
    acc.add("s", a)
    s = acc.tables()["sites"].iloc[0]
    assert s["neff_mean"] == pytest.approx(1.5) and s["neff_std"] == pytest.approx(0.5)


def test_block_mode_categories_source_counts_and_clip():
    acc = SourceAccumulator(BLOCK)
    acc.add("blocks.0.mlp_read", torch.tensor([[0.25, 0.75]]))
    acc.add("blocks.1.attn_read", torch.tensor([[0.6, 0.4]]))
    acc.add("final_read", torch.tensor([[0.2, 0.3, 0.5]]))
    t = acc.tables()
    sites, summary = t["sites"], t["summary"].iloc[0]
    assert summary["mode"] == "block" and summary["S_src"] == 2 + 2 + 3
    assert sites["n_sources"].tolist() == [2, 2, 3]
    assert sites["mass_partial"].tolist() == pytest.approx([0.75, 0.0, 0.5])
    assert sites["mass_blocks"].tolist() == pytest.approx([0.0, 0.4, 0.3])
    assert "mass_mlp" not in sites
    assert list(t["heatmap"].columns) == ["site", "embed", "block1", "partial"]
    valid = [0.25, 0.75, 0.6, 0.4, 0.2, 0.3, 0.5]
    assert summary["heatmap_clip"] == pytest.approx(np.percentile(valid, 99.5))


def test_weights_not_matching_labels_raise():
    acc = SourceAccumulator(FULL)
    with pytest.raises(ValueError, match="depth weights but 3 source labels"):
        acc.add("blocks.1.attn_read", torch.full((1, 2), 0.5))


def test_model_without_depth_routing_raises():
    with pytest.raises(ValueError, match="no depth routing"):
        effective_sources(tiny("baseline"), windows(1, 2, 8))
    with pytest.raises(ValueError, match="no depth routing"):
        effective_sources(tiny("denseformer"), windows(1, 2, 8))


@pytest.mark.parametrize("variant", ["attnres-full", "attnres-block2", "slr-block4-r8", "plr-full-r8"])
def test_routed_models(variant):
    model = tiny(variant)
    res = effective_sources(model, windows(1, 2, 8))
    sites, info = res["sites"], model.probe_info
    labels = info.extra["depth_sites"]
    assert sites["site"].tolist() == list(labels)
    assert sites["n_sources"].tolist() == [len(v) for v in labels.values()]
    assert (sites["neff_mean"] >= 1 - 1e-9).all() and (sites["neff_mean"] <= sites["n_sources"] + 1e-9).all()
    assert (sites["input_dependence"] >= -1e-9).all()
    mass = sites.filter(like="mass_").sum(axis=1)
    assert mass.tolist() == pytest.approx([1.0] * len(sites))
    assert res["summary"]["S_src"].iloc[0] == sum(len(v) for v in labels.values() if len(v) >= 2)
    heat = res["heatmap"].drop(columns=["model", "corpus"]).set_index("site")
    assert np.nansum(heat.to_numpy(), axis=1).tolist() == pytest.approx([1.0] * len(sites))


def test_zero_queries_route_uniformly():
    """At initialisation every routing query is zero, so α is uniform and N_eff equals the source count."""
    from probe.models import create

    model = create("attnres-full", n_layers=2, d_model=32, n_heads=4, d_mlp=64, n_ctx=64, vocab_size=97)
    sites = effective_sources(model, windows(1, 2, 8))["sites"]
    assert sites["neff_mean"].tolist() == pytest.approx(sites["n_sources"].astype(float).tolist(), rel=1e-6)


ROUTED = [(v, over) for v, over in every_variant() if tiny(v, **over).probe_info.has_depth_sources]  # as declared


@pytest.mark.parametrize("variant,over", ROUTED)
def test_effective_sources_equal_the_depth_weights_reference(variant, over):
    """The streamed statistics (each site's weights accumulated as the forward fires them, stopped once every site
    is read) equal the definitions computed from every site's whole hook_depth_weights
    (tests.support.analyses.sources_reference, float64), for every depth-routed variant: every column of the site
    table, the heatmap cell by cell (NaN exactly where a site does not read a source) and S_src."""
    model, toks = tiny(variant, **over), windows(2, 2, 12)
    got, ref = effective_sources(model, toks), sources_reference(model, toks)
    sites = got["sites"].drop(columns=["model", "corpus"]).set_index("site")
    want = ref["sites"].set_index("site")
    assert sorted(sites.columns) == sorted(want.columns) and sites.index.tolist() == want.index.tolist()
    torch.testing.assert_close(
        torch.tensor(sites.to_numpy(float)), torch.tensor(want[sites.columns].to_numpy(float)), rtol=1e-10, atol=1e-12
    )
    heat = got["heatmap"].drop(columns=["model", "corpus"]).set_index("site")
    expected = np.array([[ref["heatmap"][s].get(x, np.nan) for x in heat.columns] for s in heat.index])
    np.testing.assert_allclose(heat.to_numpy(float), expected, rtol=1e-10, atol=1e-12)  # NaN where NaN
    assert got["summary"]["S_src"].iloc[0] == ref["S_src"]
