"""The depth-routing cost model: its figure."""

from __future__ import annotations

import plotly.graph_objects as go

from probe.present.files import show
from probe.present.glossary import glossed

# One line on each file of this analysis an output folder may hold (probe.present.page's index.html shows them)
DESCRIPTIONS = {
    "costs.html": "FLOP and parameter costs of depth routing",
    "costs.json": "FLOP and parameter costs of depth routing (JSON)",
    "costs_costs.csv": "added FLOPs and parameters per routing method and setting",
}


def cost_figure(df):
    """Stacked bars of added FLOPs (% of the core): depth kernel and P-LR key projection, one bar per row."""
    fig = go.Figure(
        [
            go.Bar(name="depth kernel", x=df["label"], y=df["kernel_pct"]),
            go.Bar(name="P-LR key projection", x=df["label"], y=df["key_proj_pct"]),
        ]
    )
    a = df.attrs
    dims = f" (d={a['d']}, L={a['L']}, m={a['m']})" if {"d", "L", "m"} <= set(a) else ""
    fig.update_layout(
        barmode="stack",
        title="Added FLOPs per token, % of the non-embedding core" + dims,
        yaxis_title="added FLOPs (%)",
        xaxis_tickangle=-45,
    )
    return fig


TITLE = "Depth-routing costs"


def figures(result: dict) -> list:
    return [cost_figure(result["costs"])]


def sections(result: dict) -> dict:
    return {}


def text(result: dict) -> str:
    meta = result["meta"].iloc[0]
    return glossed(
        [
            f"cost model: d={meta['d']}, L={meta['L']}, m={meta['m']}; base C = L(4d^2 + 3dm) = "
            f"{meta['base_flops']:,} multiply-adds/token",
            "",
            show(
                result["costs"],
                ["label", "S_src", "added_flops", "added_flops_pct", "table1_pct", "added_params", "added_params_pct"],
                digits=5,
            ),
        ]
    )
