"""`probe sources` on a hyper-connected model (probe.analyses.streams.stream_sources): its figures, page sections,
terminal text and the descriptions of its files."""

from __future__ import annotations

import plotly.graph_objects as go

from probe.present.figures import ID_COLUMNS, fitted_heatmap, integer_ticks, result_name
from probe.present.files import header, result_meta, show
from probe.present.glossary import glossed
from probe.present.sections import drop_ids
from probe.present.terminal import summary_lines, verdict

DESCRIPTIONS = {
    "sources_stream_weights.csv": "hyper-connected streams: mean read weight (H_pre) and write weight (H_post) per "
    "read site and stream",
    "sources_stream_mixing.csv": "hyper-connected streams: mean stream mixing H_res[out, in] per connection",
    "sources_stream_massive.csv": "hyper-connected streams: largest |x| at position 0 and elsewhere per block input "
    "and stream, and the stream holding the BOS outlier",
}
SITE_COLUMNS = (
    "site",
    "n_sources",
    "neff_mean",
    "read_mass",
    "mass_embedding",
    "usage_entropy",
    "identity_distance",
    "permutation_distance",
)


def is_streams(result: dict) -> bool:
    """A stream-sources result (probe.analyses.streams.stream_sources)."""
    return "stream_weights" in result


def stream_verdicts(result: dict) -> list[str]:
    """What the reads draw on, how far the mixing is from the identity and a permutation, where the BOS outlier is."""
    s = result["summary"].iloc[0]
    n = int(s["n_streams"])
    usage = (
        f"the reads' stream-usage entropy (H_pre's and the final read's) {s['usage_entropy']:.3g} of 1 over {n} streams"
        if n > 1
        else "one stream: no stream-usage entropy"
    )
    lines = [
        f"reads draw on N_eff = {s['neff_mean']:.3g} sources on average over {int(s['n_sites'])} read sites (read "
        f"mass {s['read_mass']:.3g}: the plain residual reads 1 of each); {usage}",
        f"H_res is on average {s['identity_distance']:.3g} from the identity and {s['permutation_distance']:.3g} "
        "from its nearest permutation (Frobenius)",
    ]
    if s["bos_ratio"] > 1:
        lines.append(
            f"position 0 stands out most in stream {int(s['bos_stream'])} of block {int(s['bos_layer'])}'s input: "
            f"its largest |x| is {s['bos_ratio']:.3g}x the largest at the other positions"
        )
    elif s["bos_stream"] >= 0:
        lines.append(f"position 0 stands out in no stream (its largest |x| over the rest's: {s['bos_ratio']:.3g})")
    return lines


def stream_sections(result: dict) -> dict:
    return {
        "verdicts": stream_verdicts(result),
        "tables": [
            ("Summary", drop_ids(result["summary"])),
            ("Per read site (± std over tokens)", drop_ids(result["sites"])),
            ("Per block input and stream: position 0 against the rest", drop_ids(result["stream_massive"])),
        ],
    }


def sources_heatmap(result: dict) -> go.Figure:
    """Mean composed source coefficient: read site (x) x source (y)."""
    heat = result["heatmap"].drop(columns=[c for c in ID_COLUMNS if c in result["heatmap"]]).set_index("site")
    fig = go.Figure(fitted_heatmap(heat.to_numpy().T, list(heat.index), list(heat.columns), "mean coefficient"))
    fig.update_layout(
        title=f"What each read draws through the streams — {result_name(result)}",
        xaxis_title="read site (depth order)",
        yaxis_title="source (depth order)",
    )
    return fig


def weight_heatmap(result: dict, column: str, what: str) -> go.Figure:
    """Mean read or write weight per read site (x) and stream (y)."""
    table = result["stream_weights"].dropna(subset=[column])
    heat = table.pivot(index="stream", columns="site_index", values=column)
    sites = table.drop_duplicates("site_index").set_index("site_index")["site"]
    fig = go.Figure(fitted_heatmap(heat.to_numpy(), [sites[i] for i in heat.columns], list(heat.index), "mean"))
    fig.update_layout(title=f"{what} per stream — {result_name(result)}", xaxis_title="read site")
    return integer_ticks(fig, "y", "stream")


def connections_figure(result: dict) -> go.Figure:
    """Per connection: H_res's mean distances from the identity and the nearest permutation, H_pre's usage entropy."""
    sites = result["sites"]
    fig = go.Figure()
    for column, name in (
        ("identity_distance", "‖H_res − I‖_F"),
        ("permutation_distance", "min_P ‖H_res − P‖_F"),
        ("usage_entropy", "H_pre usage entropy / log n"),
    ):
        fig.add_trace(go.Scatter(x=sites["site"], y=sites[column], mode="lines+markers", name=name))
    fig.update_layout(
        title=f"Stream mixing and read spread, mean over tokens — {result_name(result)}",
        xaxis_title="read site",
        yaxis_rangemode="tozero",
    )
    return fig


def massive_heatmap(result: dict) -> go.Figure:
    """Largest |x| at position 0 over the largest elsewhere, per block input (x) and stream (y)."""
    table = result["stream_massive"]
    heat = table.pivot(index="stream", columns="layer", values="ratio")
    fig = go.Figure(fitted_heatmap(heat.to_numpy(), list(heat.columns), list(heat.index), "pos0 / rest"))
    fig.update_layout(title=f"Position 0's largest |x| over the rest's, per stream — {result_name(result)}")
    integer_ticks(fig, "x", "block input (layer)")
    return integer_ticks(fig, "y", "stream")


def stream_figures(result: dict, neff_figure) -> list[go.Figure]:
    """The page's figures; ``neff_figure`` draws N_eff per read site (probe.present.sources')."""
    return [
        sources_heatmap(result),
        neff_figure(result, y_title="N_eff = exp(H(|c| / Σ|c|)) (sources)"),
        weight_heatmap(result, "read_weight", "Read weight H_pre"),
        weight_heatmap(result, "write_weight", "Write weight H_post"),
        connections_figure(result),
        massive_heatmap(result),
    ]


def stream_text(result: dict) -> str:
    s = result["summary"].iloc[0].to_dict()
    keys = ("mode", "n_streams", "n_sites", "neff_mean", "read_mass", "usage_entropy", "identity_distance")
    return glossed(
        [
            header(result_meta(result)),
            "",
            "summary:",
            summary_lines(s, (*keys, "permutation_distance", "bos_layer", "bos_stream", "bos_ratio")),
            "",
            "per read site:",
            show(result["sites"], list(SITE_COLUMNS)),
        ],
        verdict(*stream_verdicts(result)),
    )
