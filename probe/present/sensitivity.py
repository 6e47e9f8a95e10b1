"""`probe sensitivity`: its figures, page sections, terminal text and the descriptions of its files."""

from __future__ import annotations

import plotly.graph_objects as go

from probe.present.files import header, result_meta, show
from probe.present.glossary import glossed
from probe.present.sections import drop_ids
from probe.present.terminal import verdict

TITLE = "Sensitivity to each input position and representational collapse"
# One line on each file of this analysis an output folder may hold (probe.present.page's index.html shows them)
DESCRIPTIONS = {
    "sensitivity.html": "sensitivity: verdict, figures, per-layer and per-position tables, collapse over lengths",
    "sensitivity.json": "sensitivity: every table and the run's settings (JSON)",
    "sensitivity_summary.csv": "per layer: sensitivity to position 0, the mean over the rest, the last; shares, decay",
    "sensitivity_positions.csv": "‖∂y_last/∂e_i‖_F per layer and input position, its share and standard errors",
    "sensitivity_collapse_summary.csv": "collapse per dtype: first and last lengths' relative distance, first collapse",
    "sensitivity_collapse_lengths.csv": "‖y(s) − y(s')‖ per length and dtype, relative to ‖y(s)‖, below bf16 or not",
    "sensitivity_meta.csv": "the run's settings",
}
SUMMARY = ("layer", "first", "rest_mean", "last", "first_share", "mixing", "decay_slope")
LENGTHS = ("length", "dtype", "distance", "relative", "below_bf16", "identical")


def figures(result):
    pos = result["positions"]
    figure = go.Figure()
    for layer, rows in pos.groupby("layer"):
        figure.add_trace(go.Scatter(x=rows["position"], y=rows["sensitivity"], mode="lines", name=f"layer {layer}"))
    figure.update_layout(
        title="‖∂y_last/∂e_i‖_F per input position", xaxis_title="position i", yaxis_title="sensitivity"
    )
    figure.update_yaxes(type="log")
    out = [figure]
    if "collapse_lengths" in result:
        col = result["collapse_lengths"]
        fig = go.Figure()
        for dtype, rows in col.groupby("dtype"):
            fig.add_trace(go.Scatter(x=rows["length"], y=rows["relative"], mode="lines+markers", name=dtype))
        fig.update_layout(
            title="representational collapse: ‖y(s) − y(s')‖ / ‖y(s)‖", xaxis_title="length n", yaxis_title="relative"
        )
        fig.update_xaxes(type="log")
        fig.update_yaxes(type="log")
        out.append(fig)
    return out


def _verdicts(result) -> list[str]:
    last = result["summary"].iloc[-1]
    slope = last["decay_slope"]  # undefined with fewer than two positions between the first and the last
    lines = [
        f"layer {int(last['layer'])}: position 0 takes {last['first_share']:.1%} of the last token's sensitivity, "
        f"positions 1..T-2 {last['mixing']:.1%}, itself {last['last_share']:.1%}; "
        + (
            f"log-log decay slope over distance {slope:.2f}"
            if slope == slope
            else "no decay slope (it needs two positions between the first and the last: --ctx 4 or more)"
        )
    ]
    if "collapse_summary" in result:
        for _, row in result["collapse_summary"].iterrows():
            lines.append(
                f"collapse in {row['dtype']}: relative distance {row['first_relative']:.3g} at n={row['first_length']}"
                f", {row['last_relative']:.3g} at n={row['last_length']}"
            )
    return lines


def sections(result):
    tables = [
        ("Per layer", drop_ids(result["summary"])),
        ("Per input position", drop_ids(result["positions"])),
    ]
    if "collapse_lengths" in result:
        tables.append(("Collapse over lengths", drop_ids(result["collapse_lengths"])))
    return {"verdicts": _verdicts(result), "tables": tables}


def text(result):
    lines = [header(result_meta(result)), "", "per layer:", show(result["summary"], list(SUMMARY))]
    last = result["positions"][result["positions"]["layer"] == result["positions"]["layer"].max()]
    lines += ["", "last layer, per position:", show(last, ["position", "sensitivity", "share", "estimator_rse"])]
    if "collapse_lengths" in result:
        lines += ["", "collapse:", show(result["collapse_lengths"], list(LENGTHS))]
    return glossed(lines, verdict(*_verdicts(result)))
