"""The Bigram-Backcopy split (Guo et al. 2024): its figure."""

from __future__ import annotations

import plotly.graph_objects as go


def backcopy_figure(result: dict) -> go.Figure:
    """Per (layer, head): the active pattern (previous token on trigger rows) beside the dormant one (BOS, and the
    phantom, on the other rows), with the causal-uniform reference as a dotted marker."""
    heads = result["heads"]
    x = [f"L{int(r.layer)}H{int(r.head)}" for r in heads.itertuples()]
    fig = go.Figure()
    for col, name in (
        ("prev_at_trigger", "previous token, trigger rows"),
        ("bos_at_trigger", "BOS, trigger rows"),
        ("bos_elsewhere", "BOS, other rows"),
        ("phantom_elsewhere", "phantom, other rows"),
        ("prev_elsewhere", "previous token, other rows"),
    ):
        fig.add_bar(x=x, y=heads[col], name=name)
    fig.add_scatter(
        x=x,
        y=heads["uniform_elsewhere"],
        mode="markers",
        name="causal-uniform (other rows)",
        marker=dict(symbol="line-ew-open", size=24, color="black"),
    )
    model = result["meta"]["model"].iloc[0] if "meta" in result else ""
    fig.update_layout(
        barmode="group",
        title=f"active/dormant split on Bigram-Backcopy: {model}",
        xaxis_title="layer, head",
        yaxis_title="attention mass (share of the row)",
        yaxis_range=[0, 1],
    )
    return fig
