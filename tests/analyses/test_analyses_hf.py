"""Sinks and injection on tiny random HF checkpoints loaded through probe.load (llama: GQA; gpt-oss: sinks, sliding)."""

import pytest
import torch

import probe
from probe.analyses.inject import inject
from probe.analyses.sinks import sink_stats, sink_stats_reference
from probe.checkpoints.tiny import build_tiny


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return lambda family: build_tiny(family, tmp_path_factory.mktemp(family))


@pytest.mark.parametrize("family", ["llama", "gpt_oss", "gpt_neox"])
def test_sinks_and_injection_on_tiny_hf_models(hf_dir, family):
    model = probe.load(str(hf_dir(family)))
    toks = torch.randint(2, 96, (2, 2, 13), generator=torch.Generator().manual_seed(0))
    fast, ref = sink_stats(model, toks), sink_stats_reference(model, toks)
    a, b = fast["heads"].select_dtypes("number"), ref["heads"].select_dtypes("number")
    assert torch.allclose(torch.tensor(a.to_numpy(float)), torch.tensor(b.to_numpy(float)), atol=1e-5, equal_nan=True)
    if family == "gpt_oss":  # learned sinks and a sliding window shorter than the sequence
        assert fast["summary"]["phantom_share"].iloc[0] > 0.05
        assert "sliding (key 0 in window)" in fast["by_type"]["layers"].tolist()
    res = inject(model, toks, junk=["structured", "gaussian"], doses=[0.0, 0.5, 4.0], progress=False)
    r = res["results"].set_index(["junk", "dose"])["delta"]
    assert r[("structured", 0.0)] == 0 and r[("gaussian", 0.0)] == 0
    assert r[("structured", 4.0)] != 0 and torch.isfinite(torch.tensor(r.to_numpy())).all()
    e = res["exposure"].iloc[0]
    assert 0 < e["quiet_share"] < 1 and (e["phantom_share"] > 0) == (family == "gpt_oss")
    assert res["meta"]["family"].iloc[0] == family


@pytest.mark.parametrize("family", ["llama", "gpt_oss", "gpt_neox"])
def test_gate_and_depth_analyses_on_hf_models_report_what_applies(hf_dir, family):
    """HF checkpoints have no value gate and no depth routing: both analyses refuse with a clear error."""
    from probe.analyses.gates import gate_stats
    from probe.analyses.sources import effective_sources

    model = probe.load(str(hf_dir(family)))
    toks = torch.randint(2, 96, (1, 2, 13), generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="depth routing"):
        effective_sources(model, toks)
    with pytest.raises(ValueError, match="has no value gate"):
        gate_stats(model, toks)
