"""`probe view` on hyper-connected models (docs/definitions.md#stream-sources) and dense ones (DenseFormer / MUDD,
docs/definitions.md#dense-weights): the depth figure holds each read's composed stream sources, or each mix's weights;
at static HC's and MUDD's init, the plain residual; their mean over the text equals `probe sources`' tables on the
same tokens; on models saved and loaded back, as a user's."""

import numpy as np
import pytest
import torch

import probe
from probe.analyses.sources import dense_weights
from probe.analyses.streams import stream_sources
from probe.analyses.view import capture_view, view_result
from probe.present import viewers as V
from tests.analyses.test_dense_weights import perturbed
from tests.analyses.test_stream_sources import randomised
from tests.present.test_viewers import decoded
from tests.support.analyses import tiny

IDS = torch.randint(0, 97, (12,), generator=torch.Generator().manual_seed(6))


def test_static_hc_at_init_draws_the_plain_residual():
    """H_pre one-hot, H_post = 1, H_res = I: every stream is the residual, every sub-layer's read weighs each source 1
    and the head's sum of the n streams weighs each n."""
    cap = capture_view(tiny("hc"), IDS)
    assert cap.depth_kind == "streams" and list(cap.depth)[-1] == "final_read"
    ((t, z),) = decoded(V.depth_viewer(cap))
    final = len(cap.sources["final_read"])
    assert z.shape == (sum(len(s) for s in cap.sources.values()), len(IDS))
    assert np.allclose(z[:-final], 1.0, atol=1e-6) and np.allclose(z[-final:], 4.0, atol=1e-6)  # n = 4 streams
    assert t["y"][:3] == ["blocks.0.attn_read ← embed", "blocks.0.mlp_read ← embed", "blocks.0.mlp_read ← attn0"]
    assert "Stream sources" in V.depth_viewer(cap).layout.title.text


@pytest.mark.parametrize("variant", ["hc-dynamic", "mhc"])
def test_the_reads_mean_over_the_text_is_the_sources_heatmap(variant, tmp_path):
    randomised(variant).save_pretrained(tmp_path / variant)
    model = probe.load(str(tmp_path / variant))
    cap = capture_view(model, IDS)
    window = torch.cat([IDS, IDS[:1]])[None, None]  # (1, 1, T+1): the analysis reads its first T tokens
    heatmap = stream_sources(model, window)["heatmap"].set_index("site")
    for site, weights in cap.depth.items():
        want = heatmap.loc[site, cap.sources[site]].to_numpy(dtype=float)
        assert np.allclose(weights.mean(0), want, rtol=1e-5, atol=1e-6), site
    ((_, z),) = decoded(V.depth_viewer(cap))
    assert (z != 1).any()  # the random mixing shows
    line = V.text(view_result(cap, "text"))
    assert "stream sources" in line and "depth weights" not in line


def test_a_model_without_streams_or_routing_is_refused_when_depth_is_asked():
    with pytest.raises(ValueError, match="no depth routing"):
        capture_view(tiny("baseline"), IDS, depth=True)


def test_mudd_at_init_draws_the_plain_residual():
    """Every mix one-hot on the latest block state (MUDD at init equals a plain transformer)."""
    cap = capture_view(tiny("mudd"), IDS)
    assert cap.depth_kind == "dense" and list(cap.depth)[:4] == [f"blocks.0.dense.{c}" for c in "qkvr"]
    for site, w in cap.depth.items():
        assert w.shape == (len(IDS), len(cap.sources[site])), site
        assert np.allclose(w[:, :-1], 0.0, atol=1e-6) and np.allclose(w[:, -1], 1.0, atol=1e-6), site
    assert "Dense mixing weights" in V.depth_viewer(cap).layout.title.text


@pytest.mark.parametrize("variant", ["mudd", "denseformer"])
def test_each_mix_mean_over_the_text_is_the_dense_weights_table(variant, tmp_path):
    perturbed(variant).float().save_pretrained(tmp_path / variant)
    model = probe.load(str(tmp_path / variant))
    cap = capture_view(model, IDS)
    window = torch.cat([IDS, IDS[:1]])[None, None]
    table = dense_weights(model, window)["dense_weights"].set_index(["layer", "stream", "source"])["weight_mean"]
    for site, weights in cap.depth.items():
        layer = int(site.split(".")[1])
        stream = site.split(".")[3] if site.count(".") == 3 else "r"
        want = [table[(layer, stream, src)] for src in cap.sources[site]]
        assert np.allclose(weights.mean(0), want, rtol=1e-5, atol=1e-6), site
    assert "dense weights" in V.text(view_result(cap, "text"))
    only = capture_view(model, IDS, sites=["blocks.0.dense" + (".q" if variant == "mudd" else "")])
    assert len(only.depth) == 1
    with pytest.raises(ValueError, match="unknown read sites"):
        capture_view(model, IDS, sites=["blocks.9.dense"])
