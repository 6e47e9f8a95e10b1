"""The depth-routing cost model: its figure."""
from __future__ import annotations
import plotly.graph_objects as go


def cost_figure(df):
    """Stacked bars of added FLOPs (% of the core): depth kernel and P-LR key projection, one bar per row."""
    fig = go.Figure([
        go.Bar(name="depth kernel", x=df["label"], y=df["kernel_pct"]),
        go.Bar(name="P-LR key projection", x=df["label"], y=df["key_proj_pct"]),
    ])
    a = df.attrs
    dims = f" (d={a['d']}, L={a['L']}, m={a['m']})" if {"d", "L", "m"} <= set(a) else ""
    fig.update_layout(barmode="stack", title="Added FLOPs per token, % of the non-embedding core" + dims,
                      yaxis_title="added FLOPs (%)", xaxis_tickangle=-45)
    return fig


