"""`probe ablate`: its terminal text, figures, page sections and the descriptions of its files."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from probe.present.figures import integer_ticks, se_bars, threshold
from probe.present.files import header, result_meta, show
from probe.present.glossary import glossed
from probe.present.sections import drop_ids, linear_note, n_batches, pm, se_caveat
from probe.present.terminal import note_lines, verdict

DESCRIPTIONS = {
    "ablate.html": "causal interventions: loss change per intervention, whole model and per layer, with figures",
    "ablate.json": "causal interventions: every table and the run's settings (JSON)",
    "ablate_results.csv": "loss change (ablated - clean, nats per token) per intervention, setting and scope, and "
    "each condition's forward time (median over batches of one timing each: indicative) over the measured clean "
    "forward's",
    "ablate_per_batch.csv": "loss change per condition and evaluation batch",
}

TITLE = "Ablations: is the sink needed?"
COLUMNS = [
    "intervention",
    "setting",
    "scope",
    "layer",
    "layer_type",
    "head",
    "site",
    "loss_clean",
    "loss_ablated",
    "delta",
    "delta_se",
    "loss_clean_late",
    "loss_ablated_late",
    "delta_late",
    "delta_late_se",
    "pos0_share_clean",
    "pos0_share_ablated",
    "register_share",
]  # a row's cost_ratio (one timing per batch: indicative) stays in the results file, shown nowhere


def _where(row, hybrid: bool = False) -> str:
    if row["scope"] == "model":
        every = "every softmax layer" if hybrid else "every layer"  # a hybrid's linear layers are not ablated
        return every if row["intervention"] != "depth" else "every read site"
    if row["scope"] == "site":
        return f"site {row['site']}"
    return f"layer {row['layer']}" + (f", head {row['head']}" if row["scope"] == "head" else "")


def _table(res: pd.DataFrame) -> pd.DataFrame:
    """The results with readable places: 'all' for every layer / head, empty columns dropped."""
    t = drop_ids(res).copy()
    for col in ("layer", "head"):
        if col in t:
            t[col] = t[col].map(lambda v: "all" if v == -1 else int(v))
    keep = [c for c in COLUMNS + ["n_batches"] if c in t and t[c].astype(str).ne("").any() and t[c].notna().any()]
    return t[keep]


def sections(result: dict) -> dict:
    """One verdict per (intervention, setting) on the whole model, with the layer it hurts most; the full table."""
    res = result["results"]
    verdicts = []
    model = res[res["scope"] == "model"]
    meta = result_meta(result)
    hybrid = bool(meta.get("linear_layers"))
    for _, row in model.iterrows():
        line = (
            f"{row['intervention']} {row['setting']} in {_where(row, hybrid)}: loss {row['delta']:+.4g}"
            f"{pm(row, 'delta', '.2g')} nats per token (ablated {row['loss_ablated']:.4g} vs clean "
            f"{row['loss_clean']:.4g}; mean ± s.e. over batches)"
        )
        if "delta_late" in row and pd.notna(row.get("delta_late")):
            line += f"; over queries t >= k + w: {row['delta_late']:+.4g}{pm(row, 'delta_late', '.2g')}"
        local = res[
            (res["intervention"] == row["intervention"])
            & (res["setting"] == row["setting"])
            & res["scope"].isin(["layer", "site"])
            & res["delta"].notna()  # a hybrid's linear layers: listed, not ablated
        ]
        if len(local):
            worst = local.loc[local["delta"].idxmax()]
            line += f"; most in {_where(worst)} ({worst['delta']:+.4g})"
        verdicts.append(line)
    caveats = se_caveat(n_batches(result)) + [n for n in [_linear(meta)] if n]
    if meta.get("knockout_query0", "n/a") != "n/a":
        caveats.append("knockout: query 0 keeps its clean row in heads without a phantom (it would see no key)")
    tables = [
        (
            "Loss change per intervention (ablated - clean, nats per token; *_se: standard error over batches; "
            "*_late: queries t >= k + w only; *_share: a test-time register's attention mass of text queries "
            "t >= 1 on the first text token, clean and edited, and on the register)",
            _table(res),
        )
    ]
    return {"verdicts": verdicts, "caveats": caveats, "tables": tables}


def _linear(meta: dict) -> str | None:
    """A hybrid model's note: its linear layers have no attention to ablate (an eviction leaves their state whole)."""
    return linear_note(meta, "the interventions (an eviction leaves a linear layer's state whole)")


def layer_figure(result: dict) -> go.Figure:
    """Loss change when one layer (or one depth read site) at a time is ablated, one line per intervention."""
    res = result["results"]
    fig = go.Figure()
    for (iv, setting), g in res[res["scope"] == "layer"].groupby(["intervention", "setting"], sort=False):
        g = g.sort_values("layer")
        fig.add_trace(
            go.Scatter(
                x=g["layer"], y=g["delta"], mode="lines+markers", error_y=se_bars(g, "delta"), name=f"{iv} {setting}"
            )
        )
    threshold(fig, 0, "no change")
    integer_ticks(fig, "x", "layer ablated (alone)")
    fig.update_layout(
        title="Which layers need what: loss change with one layer ablated (± s.e. over batches)",
        yaxis_title="loss change (nats per token)",
    )
    return fig


def model_figure(result: dict) -> go.Figure:
    """Every intervention on the whole model, as bars (± s.e. over batches)."""
    m = result["results"]
    m = m[m["scope"] == "model"]
    fig = go.Figure(
        go.Bar(
            x=[f"{a} {b}" for a, b in zip(m["intervention"], m["setting"])],
            y=m["delta"],
            error_y=se_bars(m, "delta"),
            name="every layer",
        )
    )
    fig.update_layout(
        title="Whole-model interventions: loss change (± s.e. over batches)",
        xaxis_title="intervention",
        yaxis_title="loss change (nats per token)",
    )
    return fig


def eviction_figure(result: dict) -> go.Figure:
    """Window eviction: loss change against the kept first keys k, one line per window w (and positions, where both
    are shown), over all queries and over queries t >= k + w."""
    ev = result["results"]
    ev = ev[ev["intervention"] == "evict"]
    kw = ev["setting"].str.extract(r"k=(\d+),w=(\d+)").astype(int)
    # a setting names its positions unless they are the original ones
    where = ev["setting"].str.extract(r"pos=(\w+)")[0].fillna("original")
    ev = ev.assign(k=kw[0].values, w=kw[1].values, where=where.values).sort_values("w", kind="stable")
    several = ev["where"].nunique() > 1
    fig = go.Figure()
    for (pos, w), g in ev.groupby(["where", "w"], sort=False):  # one line per (positions, w): never both on one
        g = g.sort_values("k")
        name = f"w = {w}" + (f", {pos} positions" if several else "")
        fig.add_trace(
            go.Scatter(
                x=g["k"], y=g["delta"], mode="lines+markers", error_y=se_bars(g, "delta"), name=f"{name}, all queries"
            )
        )
        if "delta_late" in g and g["delta_late"].notna().any():
            fig.add_trace(
                go.Scatter(
                    x=g["k"],
                    y=g["delta_late"],
                    mode="lines+markers",
                    line=dict(dash="dot"),
                    error_y=se_bars(g, "delta_late"),
                    name=f"{name}, queries t >= k + w",
                )
            )
    threshold(fig, 0, "full attention")
    integer_ticks(fig, "x", "kept first keys k")
    fig.update_layout(
        title=f"Window eviction (StreamingLLM, {' and '.join(dict.fromkeys(ev['where']))} positions): loss change "
        "against full attention",
        yaxis_title="loss change (nats per token)",
    )
    return fig


def head_figure(result: dict) -> go.Figure:
    """Per-head ablations (--per-head): heatmap of the loss change, layers x heads, one panel per intervention."""
    res = result["results"]
    h = res[res["scope"] == "head"]
    fig = go.Figure()
    for (iv, setting), g in h.groupby(["intervention", "setting"], sort=False):
        z = g.pivot(index="layer", columns="head", values="delta")
        fig.add_trace(
            go.Heatmap(
                z=z.values,
                x=z.columns,
                y=z.index,
                colorscale="RdBu",
                zmid=0,
                name=f"{iv} {setting}",
                visible=len(fig.data) == 0,
                colorbar=dict(title="Δ loss"),
            )
        )
    n = len(fig.data)
    buttons = [
        dict(label=t.name, method="update", args=[{"visible": [i == k for i in range(n)]}])
        for k, t in enumerate(fig.data)
    ]
    fig.update_layout(
        title="Per-head ablations: loss change (nats per token), one intervention at a time (menu)",
        xaxis_title="head",
        yaxis_title="layer",
        updatemenus=[dict(buttons=buttons, x=1.0, y=1.15, xanchor="right")] if n > 1 else [],
    )
    return fig


def site_figure(result: dict) -> go.Figure:
    """Depth-route forcings one read site at a time."""
    d = result["results"]
    d = d[d["scope"] == "site"]
    fig = go.Figure()
    for setting, g in d.groupby("setting", sort=False):
        fig.add_trace(go.Bar(x=g["site"], y=g["delta"], error_y=se_bars(g, "delta"), name=setting))
    fig.update_layout(
        title="Depth routes forced one read site at a time (± s.e. over batches)",
        barmode="group",
        xaxis_title="read site",
        yaxis_title="loss change (nats per token)",
    )
    return fig


def figures(result: dict) -> list:
    res = result["results"]
    figs = [model_figure(result)]
    if (res["scope"] == "layer").any():
        figs.append(layer_figure(result))
    if (res["intervention"] == "evict").any():
        figs.append(eviction_figure(result))
    if (res["scope"] == "head").any():
        figs.append(head_figure(result))
    if (res["scope"] == "site").any():
        figs.append(site_figure(result))
    return figs


def cost_line(meta: dict) -> str | None:
    """The cost of an ablated forward against a clean one (docs/definitions.md#ablations): the median ratio of the
    timed pairs with its interquartile range, or, when that range is too wide to say anything, no ratio."""
    if "cost_ratio" not in meta:
        return None
    wall = f"{meta['wall_s']:.3g} s in all"
    if "cost_repeats" not in meta:  # a result written before the cost was measured in repeats
        return (
            f"cost: {meta['ablated_forward_s']:.3g} s per ablated forward, {meta['clean_forward_s']:.3g} s "
            f"per clean forward ({meta['cost_ratio']:.2f}x, one pass, not warmed up), {wall}"
        )
    k, q1, q3 = meta["cost_repeats"], meta["cost_ratio_q1"], meta["cost_ratio_q3"]
    if not meta.get("cost_stated"):
        spread = f" (IQR {q1:.2f}\u2013{q3:.2f})" if k else ""
        return f"cost: not stated, the ablated / clean time ratio varied too much over {k} repeats{spread}; {wall}"
    return (
        f"cost: ablated forward {meta['cost_ratio']:.2f}x the clean one (IQR {q1:.2f}\u2013{q3:.2f} over {k} "
        f"repeats; {meta['ablated_forward_s']:.3g} s vs {meta['clean_forward_s']:.3g} s), {wall}"
    )


def text(result: dict) -> str:
    meta = result_meta(result)
    res = _table(result["results"])
    note = _linear(meta)
    lines = [
        header(meta),
        *note_lines(note),
        "",
        "loss change (ablated - clean, nats per token; mean ± s.e. over batches):",
        show(res, [c for c in COLUMNS if c not in ("loss_clean_late", "loss_ablated_late")]),
    ]
    if line := cost_line(meta):
        lines += ["", line]
    said = sections(result)["verdicts"]
    return glossed(lines, verdict(*said) if said else "")
