"""`probe view` on hyper-connected models (docs/definitions.md#stream-sources): the depth figure holds each read's
composed stream sources; at static HC's init, the plain residual (weight 1 on every source); their mean over the text
equals `probe sources`' heatmap on the same tokens; on a model saved and loaded back, as a user's."""

import numpy as np
import pytest
import torch

import probe
from probe.analyses.streams import stream_sources
from probe.analyses.view import capture_view, view_result
from probe.present import viewers as V
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
