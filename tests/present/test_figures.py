"""Every analysis has a plotly figure; figures build from the analyses' own outputs and write offline HTML."""

import numpy as np
import pandas as pd

from probe.analyses.gates import gate_stats
from probe.analyses.inject import inject
from probe.analyses.sinks import sink_stats
from probe.analyses.sources import effective_sources
from probe.analyses.stats import abstention_decomposition, paired_differences
from probe.present import figures
from probe.present.gates import gate_figure, gate_token_table
from probe.present.inject import exposure_figure, injection_figure
from probe.present.sinks import sink_figure, sink_heads_figure
from probe.present.sources import depth_heatmap, effective_sources_figure
from tests.support.analyses import tiny, windows


def test_figures_from_analysis_outputs(tmp_path):
    toks = windows(1, 3, 10, vocab=6)
    routed = effective_sources(tiny("attnres-block2"), toks)
    heat = depth_heatmap(routed)
    z = np.array(heat.data[0].z, dtype=float)
    assert z.shape == (len(routed["heatmap"].columns) - 3, 4)  # sources (y) x read sites (x); model, corpus, site
    assert heat.layout.yaxis.autorange is None  # one orientation: depth grows from the origin
    assert heat.data[0].zmax == routed["summary"]["heatmap_clip"].iloc[0]
    assert len(effective_sources_figure([routed, effective_sources(tiny("slr-block2-r8"), toks)]).data) == 3

    sinks = [sink_stats(tiny(v), toks) for v in ("baseline", "sinklogit")]
    fig = sink_figure(sinks)
    assert len(fig.data) == 2 * 3 + 2  # three panels per model, the uniform reference and the 3x threshold
    heads = sink_heads_figure(sinks[1], "phantom_share")
    assert np.array(heads.data[0].z).shape == (len(sinks[1]["heads"]["head"].unique()), 2)  # heads (y) x layers (x)

    gates = gate_stats(tiny("normgate"), toks, min_count=2)
    assert len(gate_figure(gates).data) == 3
    table = gate_token_table(gates, k=2)
    assert len(table.data[0].cells.values[0]) == 2

    inj = inject(tiny("sinklogit"), toks, junk=["gaussian", "structured"], doses=[0.2, 0.4], progress=False)
    assert len(injection_figure(inj).data) == 2
    exp = exposure_figure([inj])
    assert {t.name for t in exp.data} == {"quiet (q25)", "phantom"}

    df = pd.DataFrame(
        [
            {"variant": v, "seed": s, "loss": 3 - d * (s + 1)}
            for s in range(3)
            for v, d in (("baseline", 0), ("sinklogit", 0.01), ("normgate", 0.01), ("sink+norm", 0.015))
        ]
    )
    assert figures.paired_figure(paired_differences(df, "baseline")["summary"]).data[0].x is not None
    assert "filter share" in figures.decomposition_figure(abstention_decomposition(df)).layout.title.text

    out = tmp_path / "sinks.html"
    fig.write_html(out, include_plotlyjs=False)
    assert out.stat().st_size > 1000


def test_a_narrowed_attention_figure_labels_every_kth_token_with_room_for_each():
    """The picker heatmap of 65 tokens is laid out at 15 px a token; drawn in a 680 px column it keeps one label per
    k tokens, k the smallest that leaves each label LABEL_ROOM px of the plot (its width less the margins)."""
    from probe.present.view_attention import attention_picker_view

    T = 65
    fig = attention_picker_view([np.full((1, T, T), 1.0 / T)], [None], [f"t{i}" for i in range(T)])
    assert fig.layout.xaxis.dtick == fig.layout.yaxis.dtick == 1  # at its own size every token is labelled
    fig.update_layout(width=680, height=round(fig.layout.height * 680 / fig.layout.width))
    figures.readable_category_ticks(fig)
    margin = fig.layout.margin
    for axis, plot in (("xaxis", 680 - margin.l - 80), ("yaxis", fig.layout.height - margin.t - margin.b)):
        k = fig.layout[axis].dtick
        assert k * plot / T >= figures.LABEL_ROOM > (k - 1) * plot / T, (axis, k, plot)


def test_a_log_axis_over_one_to_three_powers_of_ten_is_labelled_at_1_2_5_as_numbers():
    import plotly.graph_objects as go

    fig = figures.log_axis(go.Figure(go.Scatter(x=[0, 1, 2], y=[8.0, 40.0, 200.0])), "y")  # 1.4 powers of ten
    assert (fig.layout.yaxis.type, fig.layout.yaxis.dtick, fig.layout.yaxis.tickformat) == ("log", "D2", "~g")
    wide = figures.log_axis(go.Figure(go.Scatter(x=[1e-3, 1e2], y=[0, 1])), "x")  # 5 powers: one label each
    assert wide.layout.xaxis.dtick == 1 and wide.layout.xaxis.tickformat == "~g"


def test_the_sensitivity_verdict_without_a_decay_slope_says_why_rather_than_nan():
    """--ctx 2 or 3 leaves fewer than two positions between the first and the last: the verdict quoted "slope nan"."""
    import pandas as pd

    from probe.present.sensitivity import _verdicts

    row = dict(layer=5, first_share=0.3, mixing=0.2, last_share=0.5)
    (line,) = _verdicts({"summary": pd.DataFrame([{**row, "decay_slope": float("nan")}])})
    assert "nan" not in line and "no decay slope (it needs two positions" in line
    (line,) = _verdicts({"summary": pd.DataFrame([{**row, "decay_slope": -1.234}])})
    assert line.endswith("log-log decay slope over distance -1.23")
