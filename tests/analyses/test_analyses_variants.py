"""Every analysis runs on every tiny custom variant it applies to, and refuses the ones it does not."""

import math

import pytest

import probe.models as pm
from probe.analyses.gates import gate_stats
from probe.analyses.inject import inject
from probe.analyses.sinks import sink_stats
from probe.analyses.sources import effective_sources
from probe.kernels.row_rules import ROW_RULES
from probe.models.gates import gate_directions
from tests.support.analyses import tiny, windows

VARIANTS = [v for v in pm.VARIANTS if "{" not in v] + ["attnres-block2", "slr-full-r8", "plr-block2-r8"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_analyses_run(variant):
    model = tiny(variant)
    info = model.probe_info
    toks = windows(1, 2, 10, vocab=8)
    s = sink_stats(model, toks)["summary"].iloc[0]
    assert all(math.isfinite(s[k]) for k in ("pos0_share", "phantom_share", "r0", "uniform_ref"))
    rule = ROW_RULES.get(info.attention_rule)
    if rule is None:
        assert (s["phantom_share"] > 0) == info.has_phantom
    else:  # a row rule reports each row's own mass; the unspent mass only where rows sum to at most one
        assert math.isfinite(s["row_mass"]) and s["row_mass"] > 0
        unspent = 1 - s["row_mass"] if rule.at_most_one else 0.0
        assert s["phantom_share"] == pytest.approx(unspent, abs=1e-6)
    directions = gate_directions(model)  # a gate that declares its own read direction gets own-direction junk
    junk = ["own-direction"] if directions and all(w is not None for w in directions.values()) else ["structured"]
    res = inject(model, toks, junk=junk, doses=[0.5], progress=False)
    assert math.isfinite(res["results"]["delta"].iloc[0]) and res["results"]["delta"].iloc[0] != 0
    if info.has_value_gate or info.has_out_gate:
        g = gate_stats(model, toks, min_count=1)["summary"].iloc[0]
        assert math.isfinite(g["mean_gate"]) and math.isfinite(g["selectivity"])
    else:
        with pytest.raises(ValueError):
            gate_stats(model, toks)
    if info.has_depth_sources:
        assert effective_sources(model, toks)["summary"]["S_src"].iloc[0] > 0
    else:
        with pytest.raises(ValueError):
            effective_sources(model, toks)
