"""`probe sources`: its terminal text, figures, page sections and the descriptions of its files."""
from __future__ import annotations

import plotly.graph_objects as go

from probe.present.console import summary_lines
from probe.present.figures import ID_COLUMNS, REFERENCE, SEQUENTIAL, integer_ticks, many, result_name
from probe.present.files import header, result_meta, show
from probe.present.sections import drop_ids

# One line on each file of this analysis an output folder may hold (probe.present.page's index.html shows them)
DESCRIPTIONS = {
    "sources.html": "depth routing: effective sources per read site, mean depth heatmap",
    "sources.json": "depth routing: every table and the run's settings (JSON)",
}


def source_sections(result: dict) -> dict:
    """Depth routing: effective sources line; summary and per-site tables."""
    s = result["summary"].iloc[0]
    verdicts = [f"effective sources N_eff = {s['neff_mean']:.3g} on average over {int(s['n_sites'])} read sites "
                f"(top-1 mass {s['top1_mass']:.3g}, input dependence {s['input_dependence']:.3g} nats)"]
    return {"verdicts": verdicts, "tables": [("Summary", drop_ids(result["summary"])),
                                             ("Per read site (± std over tokens)", drop_ids(result["sites"]))]}


def depth_heatmap(result: dict) -> go.Figure:
    """Mean depth weights: read site (x) x source identity (y), colour clipped at the 99.5th percentile."""
    heat = result["heatmap"].drop(columns=[c for c in ID_COLUMNS if c in result["heatmap"]]).set_index("site")
    clip = float(result["summary"]["heatmap_clip"].iloc[0])
    fig = go.Figure(go.Heatmap(z=heat.to_numpy().T, x=list(heat.index), y=list(heat.columns), zmin=0, zmax=clip,
                               colorscale=SEQUENTIAL, colorbar=dict(title="mean α (weight)"), hoverongaps=False))
    fig.update_layout(title=f"Mean depth weights — {result_name(result)} (colour clipped at {clip:.3g})",
                      xaxis_title="read site (depth order)", yaxis_title="source (depth order)")
    return fig


def effective_sources_figure(results) -> go.Figure:
    """N_eff per read site (± std over tokens) with the number of sources, one line per model."""
    fig = go.Figure()
    for res in many(results):
        s = res["sites"]
        fig.add_trace(go.Scatter(x=s["site_index"], y=s["neff_mean"], mode="lines+markers", name=result_name(res),
                                 error_y=dict(type="data", array=s["neff_std"], visible=True), text=s["site"]))
    s = many(results)[0]["sites"]
    fig.add_trace(go.Scatter(x=s["site_index"], y=s["n_sources"], mode="lines", line=REFERENCE,
                             name="sources available at the site"))
    fig.update_layout(title="Effective number of sources (± std over tokens)",
                      yaxis_title="N_eff = exp(H(α)) (sources)", yaxis_rangemode="tozero")
    return integer_ticks(fig, "x", "read site (index in depth order)")


TITLE = "Depth routing"


def figures(result: dict) -> list:
    return [depth_heatmap(result), effective_sources_figure(result)]


def sections(result: dict) -> dict:
    return source_sections(result)


def text(result: dict) -> str:
    s = result["summary"].iloc[0].to_dict()
    return "\n".join([header(result_meta(result)), "", "summary:",
                      summary_lines(s, ("mode", "n_sites", "S_src", "neff_mean", "top1_mass", "input_dependence")), "",
                      "per read site:", show(result["sites"], [c for c in result["sites"].columns
                                                               if c not in ("site_index", "n_tokens")])])
