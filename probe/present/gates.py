"""`probe gates`: its terminal text, figures, page sections and the descriptions of its files."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from probe.present.figures import error_bars, integer_ticks, layer_se, many, result_name, se_bars
from probe.present.files import header, result_meta, show
from probe.present.glossary import glossed
from probe.present.sections import drop_ids, linear_note, n_batches, pm, se_caveat, with_se
from probe.present.terminal import note_lines, summary_lines, verdict

# One line on each file of this analysis an output folder may hold (probe.present.page's index.html shows them)
DESCRIPTIONS = {
    "gates.html": "value gates: summary, per-layer table, most / least attenuated tokens, figures",
    "gates.json": "value gates: every table and the run's settings (JSON)",
    "gates_summary.csv": "gate statistics averaged over rows, heads and layers",
    "gates_layers.csv": "gate statistics per layer",
    "gates_heads.csv": "gate statistics per layer and head",
    "gates_tokens.csv": "mean gate per token (tokens seen at least --min-count times)",
    "gates_batches.csv": "gate statistics per evaluation batch and layer (for standard errors)",
}


MAX_CHANCE_SHARE = 0.05  # token-identity share a token-blind gate reaches by chance, above which we warn


def gate_sections(result: dict, k: int = 10) -> dict:
    """Gates: mean gate, selectivity and token-identity lines; summary, per layer (± s.e.), token tables."""
    s = result["summary"].iloc[0]
    tokens, min_count = result["tokens"], int(s.get("min_count", 0))
    meta = result.get("meta")
    output = meta is not None and "out_gate" in meta and meta["gate"].iloc[0] == "output"
    verdicts = [
        f"mean gate {s['mean_gate']:.3g} (attention-weighted), selectivity {s['selectivity']:.3g}, "
        f"{s['frac_below_half']:.1%} of reads gated below 0.5"
        if not output
        else f"output gate ({meta['out_gate'].iloc[0]}): mean gate {s['mean_gate']:.3g} over rows, selectivity "
        f"(sd over queries) {s['selectivity']:.3g}, {s['frac_below_half']:.1%} of rows gated below 0.5",
        f"token identity explains {s['token_share']:.1%}{pm(s, 'token_share')} of the gate variance "
        f"({s['token_share_min_count']:.1%}{pm(s, 'token_share_min_count')} over tokens seen >= {min_count} "
        "times; ± jackknife s.e. over batches)",
    ]
    caveats = se_caveat(n_batches(result)) + [n for n in [_linear(result)] if n]
    for label, n, u in (
        ("all tokens", s.get("n_token_reads"), s.get("n_token_types")),
        (f"tokens seen >= {min_count} times", s.get("n_frequent_reads"), s.get("n_frequent_types")),
    ):
        chance = (u - 1) / (n - 1) if n and u and n > 1 else None  # between/total share of a gate blind to tokens
        if chance is not None and chance > MAX_CHANCE_SHARE:
            caveats.append(
                f"token-identity share over {label} rests on {int(n)} reads of {int(u)} distinct tokens: "
                f"a gate unrelated to token identity would already score about {chance:.0%} "
                "((types - 1) / (reads - 1)); too small a sample, use more --batches"
            )
    empty = f"no token occurs {min_count} times in these windows (lower --min-count or use more --batches)"
    tables = [
        (
            "Summary (rows t >= 1, averaged over heads and layers; token_share*_se: jackknife standard error over "
            "batches)",
            drop_ids(result["summary"]),
        ),
        (
            "Per layer (± standard error over batches)",
            with_se(result["layers"], result.get("batches"), ["mean_gate", "selectivity", "read_mean_gate"]),
        ),
        (f"Most attenuated tokens (count >= {min_count})", drop_ids(tokens.head(k)), empty),
        (f"Least attenuated tokens (count >= {min_count})", drop_ids(tokens.tail(k).iloc[::-1]), empty),
    ]
    return {"verdicts": verdicts, "caveats": caveats, "tables": tables}


def _linear(result: dict) -> str | None:
    """A hybrid model's note: its linear layers have no attention, hence no gate."""
    return linear_note(result_meta(result), "gate statistics (a gate sits on attention)", covered="gated")


def gate_figure(results) -> go.Figure:
    """Per layer: attention-weighted mean gate, selectivity, and share of gate variance explained by token identity;
    one line per model, ± standard error over batches where the result has per-batch rows."""
    panels = (
        ("mean_gate", "mean gate", "gate g (0 = closed, 1 = open)"),
        ("selectivity", "selectivity", "std of g under attention"),
        ("token_share", "token-identity share", "share of gate variance"),
    )
    fig = make_subplots(rows=1, cols=3, subplot_titles=[t for _, t, _ in panels], horizontal_spacing=0.07)
    for res in many(results):
        lay, batches = res["layers"], res.get("batches")
        for col, (key, _, _) in enumerate(panels, start=1):
            # token-identity share: a ratio of sums with its jackknife s.e. in the layers table
            bars = se_bars(lay, key) or error_bars(layer_se(batches, key, by=("layer",)), lay["layer"])
            fig.add_trace(
                go.Scatter(
                    x=lay["layer"],
                    y=lay[key],
                    mode="lines+markers",
                    name=result_name(res),
                    legendgroup=result_name(res),
                    showlegend=col == 1,
                    error_y=bars,
                ),
                row=1,
                col=col,
            )
    for col, (_, _, unit) in enumerate(panels, start=1):
        fig.update_yaxes(title_text=unit, rangemode="tozero", row=1, col=col)
    integer_ticks(fig, "x", "layer")
    fig.update_layout(title="Value gates per layer")
    return fig


def gate_token_table(result: dict, k: int = 10) -> go.Figure:
    """The k most and k least attenuated tokens (mean gate over occurrences, layers and heads)."""
    tok = result["tokens"]
    low, high = tok.head(k), tok.tail(k).iloc[::-1]
    cells = [
        list(low["token"].map(repr)),
        [f"{x:.3f}" for x in low["mean_gate"]],
        list(low["count"]),
        list(high["token"].map(repr)),
        [f"{x:.3f}" for x in high["mean_gate"]],
        list(high["count"]),
    ]
    fig = go.Figure(
        go.Table(
            header=dict(values=["most attenuated", "gate", "count", "least attenuated", "gate", "count"]),
            cells=dict(values=cells),
        )
    )
    fig.update_layout(title=f"Mean gate per token — {result_name(result)}")
    return fig


TITLE = "Value gates"


def figures(result: dict) -> list:
    return [gate_figure(result)] + ([gate_token_table(result)] if len(result["tokens"]) else [])


def sections(result: dict) -> dict:
    return gate_sections(result)


def text(result: dict) -> str:
    meta = result_meta(result)
    min_count = meta["min_count"]
    s = result["summary"].iloc[0].to_dict()
    tokens = result["tokens"].assign(token=lambda t: t["token"].map(repr))  # show spaces and newlines
    note = _linear(result)
    lines = [
        header(meta),
        *note_lines(note),
        "",
        "summary:",
        summary_lines(
            s,
            (
                "value_gate",
                "mean_gate",
                "selectivity",
                "spread",
                "read_mean_gate",
                "frac_below_half",
                "token_share",
                "token_share_min_count",
            ),
        ),
        "",
        "per layer:",
        show(result["layers"]),
    ]
    cols = ["token", "token_id", "count", "mean_gate"]
    if 0 < len(tokens) <= 20:
        lines += ["", f"tokens with count >= {min_count}, most attenuated first:", show(tokens, cols)]
    elif len(tokens):
        lines += [
            "",
            f"most attenuated tokens (count >= {min_count}):",
            show(tokens.head(10), cols),
            "",
            "least attenuated tokens:",
            show(tokens.tail(10).iloc[::-1], cols),
        ]
    else:
        lines += ["", f"no token occurs {min_count} times in these windows (lower --min-count)"]
    return glossed(lines, verdict(*gate_sections(result)["verdicts"]))
