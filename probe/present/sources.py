"""`probe sources`: its terminal text, figures, page sections and the descriptions of its files."""

from __future__ import annotations

import plotly.graph_objects as go

from probe.present.figures import ID_COLUMNS, REFERENCE, SEQUENTIAL, SIGNED, integer_ticks, many, result_name
from probe.present.files import header, result_meta, show
from probe.present.glossary import glossed
from probe.present.sections import drop_ids
from probe.present.streams import is_streams, stream_figures, stream_sections, stream_text
from probe.present.terminal import summary_lines, verdict

# One line on each file of this analysis an output folder may hold (probe.present.page's index.html shows them)
DESCRIPTIONS = {
    "sources.html": "depth routing: effective sources per read site, mean depth heatmap",
    "sources.json": "depth routing: every table and the run's settings (JSON)",
    "sources_dense_weights.csv": "dense connections: mean and std over tokens of each mix weight, per layer, stream "
    "and source block state",
    "sources_dense_layers.csv": "dense connections: weight on the latest block state, the embedding and earlier states "
    "per layer and stream",
}


def is_dense(result: dict) -> bool:
    """A dense-connection result (probe.analyses.sources.dense_weights) rather than a depth-routing one."""
    return "dense_weights" in result


def dense_verdict(result: dict) -> str:
    """One line: where the dense mixes put their weight, against the plain residual (1 on the latest state)."""
    s = result["summary"].iloc[0]
    return (
        f"dense mixes put mean weight {s['latest_weight']:.3g} on the latest block state, {s['embed_weight']:.3g} "
        f"on the embedding and {s['earlier_weight']:.3g} on earlier block states (sum {s['weight_sum']:.3g}; "
        f"{int(s['n_layers'])} layers x up to {int(s['n_streams'])} streams); the plain residual is 1 / 0 / 0, "
        f"largest deviation of a mean weight from it {s['residual_distance']:.3g}"
    )


def dense_sections(result: dict) -> dict:
    """Dense connections: the weight line; summary and per-layer tables (the per-source weights are the CSV)."""
    return {
        "verdicts": [dense_verdict(result)],
        "tables": [
            ("Summary", drop_ids(result["summary"])),
            ("Per layer and stream (mean weights over tokens)", drop_ids(result["dense_layers"])),
        ],
    }


def dense_heatmaps(result: dict) -> list[go.Figure]:
    """One heatmap per stream: mix after block l (x) x source block state (y), mean weight over tokens, colour
    centred on 0 (MUDD's per-token weights may be negative)."""
    w = result["dense_weights"]
    span = float(w["weight_mean"].abs().max()) or 1.0
    sources = list(dict.fromkeys(w.sort_values("source_index")["source"]))
    figs = []
    for stream in dict.fromkeys(w["stream"]):
        heat = w[w["stream"] == stream].pivot(index="source", columns="layer", values="weight_mean")
        heat = heat.reindex([x for x in sources if x in heat.index])
        std = w[w["stream"] == stream].pivot(index="source", columns="layer", values="weight_std").reindex(heat.index)
        fig = go.Figure(
            go.Heatmap(
                z=heat.to_numpy(),
                x=[str(c) for c in heat.columns],
                y=list(heat.index),
                customdata=std.to_numpy(),
                zmin=-span,
                zmax=span,
                colorscale=SIGNED,
                colorbar=dict(title="mean weight"),
                hoverongaps=False,
                hovertemplate="layer %{x}, %{y}: %{z:.4g} ± %{customdata:.3g}<extra></extra>",
            )
        )
        fig.update_layout(
            title=f"Dense-connection weights, stream {stream} — {result_name(result)}",
            xaxis_title="mix after block (layer)",
            yaxis_title="source block state",
        )
        figs.append(fig)
    return figs


def source_sections(result: dict) -> dict:
    """Depth routing: effective sources line; summary and per-site tables (dense connections: their weights)."""
    if is_dense(result):
        return dense_sections(result)
    if is_streams(result):
        return stream_sections(result)
    s = result["summary"].iloc[0]
    verdicts = [
        f"effective sources N_eff = {s['neff_mean']:.3g} on average over {int(s['n_sites'])} read sites "
        f"(top-1 mass {s['top1_mass']:.3g}, input dependence {s['input_dependence']:.3g} nats)"
    ]
    return {
        "verdicts": verdicts,
        "tables": [
            ("Summary", drop_ids(result["summary"])),
            ("Per read site (± std over tokens)", drop_ids(result["sites"])),
        ],
    }


def depth_heatmap(result: dict) -> go.Figure:
    """Mean depth weights: read site (x) x source identity (y), colour clipped at the 99.5th percentile."""
    heat = result["heatmap"].drop(columns=[c for c in ID_COLUMNS if c in result["heatmap"]]).set_index("site")
    clip = float(result["summary"]["heatmap_clip"].iloc[0])
    fig = go.Figure(
        go.Heatmap(
            z=heat.to_numpy().T,
            x=list(heat.index),
            y=list(heat.columns),
            zmin=0,
            zmax=clip,
            colorscale=SEQUENTIAL,
            colorbar=dict(title="mean α (weight)"),
            hoverongaps=False,
        )
    )
    fig.update_layout(
        title=f"Mean depth weights — {result_name(result)} (colour clipped at {clip:.3g})",
        xaxis_title="read site (depth order)",
        yaxis_title="source (depth order)",
    )
    return fig


def effective_sources_figure(results, y_title: str = "N_eff = exp(H(α)) (sources)") -> go.Figure:
    """N_eff per read site (± std over tokens) with the number of sources, one line per model."""
    fig = go.Figure()
    for res in many(results):
        s = res["sites"]
        fig.add_trace(
            go.Scatter(
                x=s["site_index"],
                y=s["neff_mean"],
                mode="lines+markers",
                name=result_name(res),
                error_y=dict(type="data", array=s["neff_std"], visible=True),
                text=s["site"],
            )
        )
    s = many(results)[0]["sites"]
    fig.add_trace(
        go.Scatter(
            x=s["site_index"], y=s["n_sources"], mode="lines", line=REFERENCE, name="sources available at the site"
        )
    )
    fig.update_layout(
        title="Effective number of sources (± std over tokens)",
        yaxis_title=y_title,
        yaxis_rangemode="tozero",
    )
    return integer_ticks(fig, "x", "read site (index in depth order)")


TITLE = "Depth routing"


def figures(result: dict) -> list:
    if is_dense(result):
        return dense_heatmaps(result)
    if is_streams(result):
        return stream_figures(result, effective_sources_figure)
    return [depth_heatmap(result), effective_sources_figure(result)]


def sections(result: dict) -> dict:
    return source_sections(result)


def text(result: dict) -> str:
    if is_streams(result):
        return stream_text(result)
    s = result["summary"].iloc[0].to_dict()
    if is_dense(result):
        return glossed(
            [
                header(result_meta(result)),
                "",
                "summary:",
                summary_lines(
                    s,
                    (
                        "mode",
                        "n_layers",
                        "n_streams",
                        "latest_weight",
                        "embed_weight",
                        "earlier_weight",
                        "weight_sum",
                        "residual_distance",
                    ),
                ),
                "",
                "per layer and stream (mean weights over tokens):",
                show(result["dense_layers"], [c for c in result["dense_layers"].columns if c != "n_tokens"]),
            ],
            verdict(dense_verdict(result)),
        )
    return glossed(
        [
            header(result_meta(result)),
            "",
            "summary:",
            summary_lines(s, ("mode", "n_sites", "S_src", "neff_mean", "top1_mass", "input_dependence")),
            "",
            "per read site:",
            show(result["sites"], [c for c in result["sites"].columns if c not in ("site_index", "n_tokens")]),
        ],
        verdict(*source_sections(result)["verdicts"]),
    )
