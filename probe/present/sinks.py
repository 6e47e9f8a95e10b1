"""`probe sinks`: its terminal text, figures, page sections and the descriptions of its files. Sink^eps, massive
activations and dormant heads (parts of the same verb) have their own modules; this one puts them together, and shows
attention entropy (--entropy), outlier kurtosis (--kurtosis) and norm-weighted key-0 shares (--norm-weighted)
itself."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from probe.analyses.finite import nonfinite_sentence
from probe.analyses.sinks import BRANCH_COLUMNS, SINK_FACTOR, SINK_R0
from probe.analyses.stats import batch_se
from probe.present import dormant, massive, sink_eps
from probe.present.figures import (
    REFERENCE,
    error_bars,
    fitted_heatmap,
    integer_ticks,
    layer_se,
    many,
    result_name,
    threshold,
)
from probe.present.files import header, result_meta, show
from probe.present.glossary import glossed, remark
from probe.present.sections import drop_ids, linear_note, n_batches, pm, se_caveat, with_se
from probe.present.terminal import note_lines, summary_lines, verdict

# One line on each file of this analysis an output folder may hold (probe.present.page's index.html shows them)
DESCRIPTIONS = {
    "sinks.html": "attention sinks: verdict, summary and per-layer tables, figures",
    "sinks.json": "attention sinks: every table and the run's settings (JSON)",
    "sinks_summary.csv": "sink statistics averaged over rows, heads and layers; sink_formed",
    "sinks_by_type.csv": "sink statistics per layer type (full / sliding / chunked attention)",
    "sinks_layers.csv": "sink statistics per layer",
    "sinks_heads.csv": "sink statistics per layer and head",
    "sinks_batches.csv": "sink statistics per evaluation batch and layer (for standard errors)",
    "sinks_nonfinite.csv": "tensors with NaN or infinite entries (--allow-nonfinite): why no verdict is drawn",
    "sinks_entropy_summary.csv": "attention entropy (Zhai et al.): means over layers, the lowest layer and head",
    "sinks_entropy_layers.csv": "attention entropy per layer, raw (nats) and normalised, ± s.e. over batches",
    "sinks_entropy_heads.csv": "attention entropy per layer and head, raw (nats) and normalised, ± s.e. over batches",
    "sinks_entropy_batches.csv": "attention entropy per evaluation batch, layer and head (for standard errors)",
    "sinks_kurtosis_summary.csv": "outlier features (He et al.): kurtosis of neuron RMS over layers",
    "sinks_kurtosis_layers.csv": "kurtosis of neuron RMS per layer (residual stream after each block), jackknife s.e.",
    "sinks_kurtosis_batches.csv": "kurtosis of neuron RMS per evaluation batch and layer",
    "sinks_norm_weighted_summary.csv": "key 0's share by weight and by norm ||a f(x)|| (Kobayashi et al.), over layers",
    "sinks_norm_weighted_layers.csv": "key 0's share by weight and by norm per layer, ± s.e. over batches",
    "sinks_norm_weighted_heads.csv": "key 0's share by weight and by norm per layer and head, their ratio",
    "sinks_norm_weighted_batches.csv": "key 0's share by weight and by norm per evaluation batch, layer and head",
    "sinks_register_neurons.csv": "register neurons (Jiang et al.): MLP neurons large at the high-norm positions",
}


def nonfinite(result: dict):
    """The result's ``nonfinite`` table (tensors with NaN or infinite entries, --allow-nonfinite), None when every
    captured tensor was finite."""
    table = result.get("nonfinite")
    return table if table is not None and len(table) else None


def nonfinite_lines(table) -> list[str]:
    """The terminal lines marking a result's numbers as computed over non-finite values (--allow-nonfinite)."""
    return [
        "",
        "non-finite values (NaN or infinite entries, summed over batches; in the tables above '-' marks a NaN and a "
        "column that is NaN throughout is left out):",
        show(table),
    ]


def sink_sentence(s) -> str:
    """Whether a sink has formed (docs/definitions.md#sink-rule), with the numbers the rule read: a summary row of
    the sink statistics (``probe sinks``'s, or the clean pass of ``probe inject``). A row whose rule read a number
    that is not finite (``sink_formed`` None) gets no verdict."""
    if s["sink_formed"] is None or pd.isna(s["sink_formed"]):
        return (
            f"no sink verdict: the rule reads {float(s['pos0_over_uniform']):.3g}x the causal-uniform share and r0 "
            f"{float(s['r0_later']):.2g}, and a number that is not finite decides nothing"
        )
    ratio, r0 = float(s["pos0_over_uniform"]), float(s["r0_later"])
    softmax = s.get("layers") == "softmax"  # a hybrid model: the means are over its softmax layers
    over = "its softmax layers" if softmax else "all layers"
    where = f"position 0 takes {float(s['pos0_share']):.1%} of each row's real attention over {over}"
    phantom = float(s.get("phantom_share", 0) or 0)
    also = f" (the phantom {phantom:.1%} of all mass)" if phantom > 0 else ""
    mass = s.get("row_mass")
    if mass is not None and not pd.isna(mass) and "pos0_share_1" in s:  # signed rows (DIFF)
        also = f" (each row's signed mass is {float(mass):.3g}; its shares are taken of its absolute mass Σ|a|)"
    elif mass is not None and not pd.isna(mass):  # a row rule: no phantom, rows of their own mass
        also = f" (each row spends {float(mass):.3g} of attention mass, " + (
            f"{phantom:.1%} left unspent)" if phantom > 0 else "its shares taken of that mass)"
        )
    one = "in its one softmax layer" if softmax else "in its one layer"
    later = "past layer 0" if int(s.get("n_layers", 2)) > 1 else one
    if bool(s["sink_formed"]):
        return (
            f"a sink has formed: {where}{also}, {ratio:.3g}x the causal-uniform share {later}, with its value read "
            f"drained (r0 {r0:.2g}); the rule: >= {SINK_FACTOR:g}x and r0 < {SINK_R0:g}"
        )
    parts = [f"{ratio:.3g}x the causal-uniform share {later}"]
    parts[0] += f" (a sink needs >= {SINK_FACTOR:g}x)" if ratio < SINK_FACTOR else ""
    parts[0] += f" — {words}" if (words := remark("pos0_over_uniform", ratio)) else ""
    parts += [f"r0 {r0:.2g} (a sink needs < {SINK_R0:g})"] if r0 >= SINK_R0 else []
    parts[-1] += f" — {words}" if (words := remark("r0", r0)) else ""
    return f"no sink has formed: {where}{also}; {', '.join(parts)}"


def _later(layers: pd.DataFrame) -> pd.DataFrame:
    """The layers past the first that the sink rule reads: softmax ones (a hybrid's linear layers have no sink)."""
    if "layer_type" in layers:
        layers = layers[layers["layer_type"] != "linear"]
    return layers[layers["layer"] > 0] if len(layers) > 1 else layers


def sink_sections(result: dict) -> dict:
    """Sinks: the sink_formed verdict with its rule, Sink^eps lines; summary, per-layer (± s.e.), Sink^eps tables."""
    bad = nonfinite(result)
    tables = [_summary_table(result)]
    if len(result.get("by_type", ())) > 1:
        tables.append(("By layer type", drop_ids(result["by_type"])))
    tables.append(
        (
            "Per layer (± standard error over batches)",
            with_se(result["layers"], result.get("batches"), ["pos0_share", "phantom_share", "r0"]),
        )
    )
    tables += _companion_tables(result)
    if bad is not None:
        tables.insert(0, ("Non-finite values (NaN or infinite entries; no verdict is drawn)", drop_ids(bad)))
    caveats = se_caveat(n_batches(result)) + [n for n in [linear_note(result_meta(result))] if n]
    return {"verdicts": _sink_verdicts(result, bad), "caveats": caveats, "tables": tables}


def _sink_verdicts(result: dict, bad: pd.DataFrame | None) -> list[str]:
    """The sink_formed verdict with its rule (none drawn over non-finite values) and one line per Sink^eps."""
    s = result["summary"].iloc[0]
    verdicts = [
        f"sink_formed: {bool(s['sink_formed']) if bad is None else 'no verdict'} — rule: position-0 share >= "
        f"{SINK_FACTOR:g}x the causal-uniform reference and r0 < {SINK_R0:g}, averaged over the layers past the first "
        f"(here {s['pos0_over_uniform']:.3g}x and r0 = {s['r0_later']:.3g})"
    ]
    if bad is not None:
        verdicts.insert(0, nonfinite_sentence(bad))
    if "sink_eps_summary" in result and bad is None:
        key0 = result["sink_eps_summary"]["key0"].iloc[0] if "key0" in result["sink_eps_summary"] else "key 0"
        for _, e in result["sink_eps_summary"].iterrows():
            verdicts.append(
                f"Sink^{e['epsilon']:g}: {int(e['n_sink_heads'])} of {int(e['n_heads'])} heads "
                f"({e['sink_share']:.1%}{pm(e, 'sink_share')}) put more than {e['epsilon']:g} of their "
                f"mean attention on {key0}"
            )
    return verdicts


def _summary_table(result: dict) -> tuple[str, pd.DataFrame]:
    """The summary, with the standard errors over batches of the layers past the first that the rule averages."""
    batches = result.get("batches")
    later = _later(result["layers"])
    later_b = batches[batches["layer"].isin(later["layer"])] if batches is not None and len(batches) else None
    se = batch_se(later_b, ["pos0_share", "uniform_ref", "r0"], by=None)
    summary = drop_ids(result["summary"])
    if se is not None:
        summary = summary.assign(pos0_share_later_se=se["pos0_share_se"].iloc[0], r0_later_se=se["r0_se"].iloc[0])
    return (
        "Summary (rows t >= 1, averaged over heads and layers; *_later_se: s.e. over batches of the "
        "layers past the first)",
        summary,
    )


def _companion_tables(result: dict) -> list[tuple]:
    """The tables of the analyses the sink pass fed alongside, those the run asked for: Sink^eps, massive
    activations, dormant heads, attention entropy, outlier features."""
    tables: list[tuple] = []
    if "sink_eps_summary" in result:
        tables.append(
            (
                "Sink^eps (Gu et al.): heads whose mean attention on key 0 exceeds eps (*_se: jackknife "
                "standard error over batches)",
                drop_ids(result["sink_eps_summary"]),
            )
        )
    if "sink_eps_layers" in result:
        tables.append(
            ("Sink^eps per layer (± jackknife standard error over batches)", drop_ids(result["sink_eps_layers"]))
        )
    if "massive_layers" in result:
        tables.append(
            (
                "Massive activations (Sun et al.; |h| > 100 and > 1000x the median)",
                drop_ids(result["massive_layers"]),
                "no layer has a massive activation in these windows",
            )
        )
    if "dormant_summary" in result:
        tables.append(("Active / dormant heads per input domain (Guo et al.)", drop_ids(result["dormant_summary"])))
        tables.append(
            (
                "Heads that switch between active and dormant across domains",
                drop_ids(result["dormant_switching"]),
                "no head switches between the domains",
            )
        )
    if "entropy_layers" in result:
        tables.append(
            (
                "Attention entropy per layer (Zhai et al.; rows t >= 1, entropy in nats, *_norm over log of the "
                "row's outcomes: 1 uniform, 0 one-hot; ± s.e. over batches)",
                drop_ids(result["entropy_layers"]),
            )
        )
    if "register_neurons" in result:
        tables.append(
            (
                "Register neurons (Jiang et al.; mean |MLP activation| at the outlier positions: high norm, or "
                "position 0 with --register-at-sink)",
                drop_ids(result["register_neurons"]),
            )
        )
    if "kurtosis_layers" in result:
        tables.append(
            (
                "Outlier features per layer (He et al.; kurtosis of neuron RMS at hook_resid_post, 1 when every "
                "neuron has the same RMS; jackknife s.e. over batches)",
                drop_ids(result["kurtosis_layers"]),
            )
        )
    tables += norm_weighted_tables(result)
    return tables


def norm_weighted_tables(result: dict) -> list:
    """The page's norm-weighted section (--norm-weighted): per layer key 0's share by weight and by norm."""
    if "norm_weighted_layers" not in result:
        return []
    title = (
        "Key 0's share by weight and by norm per layer (Kobayashi et al.; share = a_t0 / sum_j a_tj, norm_share = "
        "||a_t0 f(v_0)|| / sum_j ||a_tj f(v_j)||, f(v) = v W_O[h]; key0_norm and row_norm: what key 0 and the row "
        "write, their norms; rows t >= 1; ± s.e. over batches)"
    )
    return [(title, drop_ids(result["norm_weighted_layers"]))]


def norm_weighted_lines(result: dict) -> list[str]:
    """The terminal's norm-weighted lines (--norm-weighted): per layer, and the strongest sink head's two shares."""
    if "norm_weighted_layers" not in result:
        return []
    lines = [
        "",
        "key 0's share by weight and by norm ||a f(x)|| per layer (Kobayashi et al.; rows t >= 1):",
        show(
            result["norm_weighted_layers"],
            ["layer", "layer_type", "share", "norm_share", "norm_share_se", "key0_norm", "row_norm"],
        ),
    ]
    s = result["norm_weighted_summary"].iloc[0]
    if int(s["top_head"]) >= 0:
        lines.append(
            f"largest share: layer {int(s['top_layer'])} head {int(s['top_head'])}, share {float(s['top_share']):.3g}"
            f", norm_share {float(s['top_norm_share']):.3g}"
        )
    return lines


SINK_PANELS = (
    ("pos0_share", "position-0 share", "share of real attention mass"),
    ("phantom_share", "phantom share", "share of all attention mass"),
    ("r0", "r0 = ‖v0‖ / median ‖vj‖", "read-norm ratio"),
)  # axis titles short enough to stand between three panels in a 680 px column


def sink_profile_figure(
    layers: pd.DataFrame, batches: pd.DataFrame | None = None, title: str = "Attention sinks per layer"
) -> go.Figure:
    """Per-layer profiles overlaid across models (one line per ``model``, ± s.e. over batches): position-0 share with
    the causal-uniform reference and the 3x sink threshold, phantom share, r0 with its 0.8 threshold."""
    fig = make_subplots(rows=1, cols=3, subplot_titles=[t for _, t, _ in SINK_PANELS], horizontal_spacing=0.1)
    colours = qualitative.Plotly
    for i, (model, lay) in enumerate(layers.groupby("model", sort=False)):
        colour = colours[i % len(colours)]
        for col, (key, _, _) in enumerate(SINK_PANELS, start=1):
            se = layer_se(
                batches[batches["model"] == model] if batches is not None and "model" in batches else batches,
                key,
                by=("layer",),
            )
            fig.add_trace(
                go.Scatter(
                    x=lay["layer"],
                    y=lay[key],
                    mode="lines+markers",
                    name=str(model),
                    legendgroup=str(model),
                    showlegend=col == 1,
                    line=dict(color=colour),
                    error_y=error_bars(se, lay["layer"]),
                ),
                row=1,
                col=col,
            )
    ref = layers.drop_duplicates("layer").sort_values("layer")
    fig.add_trace(
        go.Scatter(x=ref["layer"], y=ref["uniform_ref"], mode="lines", line=REFERENCE, name="causal-uniform reference"),
        row=1,
        col=1,
    )
    fig.add_trace(
        go.Scatter(
            x=ref["layer"],
            y=SINK_FACTOR * ref["uniform_ref"],
            mode="lines",
            line=dict(dash="dash", color="gray"),
            name=f"{SINK_FACTOR:g} x uniform (sink threshold)",
        ),
        row=1,
        col=1,
    )
    threshold(fig, SINK_R0, f"r0 = {SINK_R0:g} (sink threshold)", row=1, col=3)
    for col, (_, _, unit) in enumerate(SINK_PANELS, start=1):
        fig.update_yaxes(title_text=unit, rangemode="tozero", row=1, col=col)
    integer_ticks(fig, "x", "layer")
    fig.update_layout(
        title=f"{title} (± standard error over batches)" if batches is not None else title,
        legend=dict(orientation="h", y=-0.2),
    )
    return fig


def sink_figure(results) -> go.Figure:
    """Per layer: position-0 share (with the causal-uniform reference), phantom share, r0; one line per model."""
    results = many(results)
    layers = pd.concat([r["layers"].assign(model=result_name(r)) for r in results], ignore_index=True)
    batches = [r["batches"].assign(model=result_name(r)) for r in results if "batches" in r and len(r["batches"])]
    return sink_profile_figure(layers, pd.concat(batches, ignore_index=True) if batches else None)


def sink_heads_figure(result: dict, value: str = "pos0_share") -> go.Figure:
    """Layer (x) x head (y) heatmap of one sink statistic, colour fitted to its range."""
    h = result["heads"].pivot(index="head", columns="layer", values=value)
    fig = go.Figure(fitted_heatmap(h.to_numpy(), list(h.columns), list(h.index), value))
    fig.update_layout(title=f"{value} per head — {result_name(result)}")
    integer_ticks(fig, "x", "layer")
    return integer_ticks(fig, "y", "head")


TITLE = "Attention sinks"


def figures(result: dict, dormant_result: dict | None = None) -> list:
    """The page's figures; ``dormant_result``: the whole ``dormant_heads`` result (its per-input rows are drawn but not
    written as a file), without which the dormant figures are left out."""
    out = [
        sink_figure(result),
        sink_heads_figure(result, "pos0_share"),
        sink_heads_figure(result, "r0"),
        sink_eps.sink_eps_figure(sink_eps.part(result)),
    ]
    if "massive_layers" in result:
        out.append(massive.massive_figure(massive.part(result)))
    if dormant_result is not None:
        out += [dormant.dormant_figure(dormant_result), dormant.dormant_heads_figure(dormant_result)]
    if "entropy_heads" in result:
        out.append(sink_heads_figure({"heads": result["entropy_heads"], "meta": result["meta"]}, "entropy_norm"))
    if "kurtosis_layers" in result:
        out.append(kurtosis_figure(result))
    if "norm_weighted_heads" in result:
        out.append(sink_heads_figure({"heads": result["norm_weighted_heads"], "meta": result["meta"]}, "norm_share"))
    return out


def kurtosis_figure(result: dict) -> go.Figure:
    """Kurtosis of neuron RMS per layer (± jackknife s.e.), with its floor of 1 (every neuron the same RMS)."""
    lay = result["kurtosis_layers"]
    fig = go.Figure(
        go.Scatter(
            x=lay["layer"],
            y=lay["kurtosis"],
            mode="lines+markers",
            name="kurtosis",
            error_y=dict(type="data", array=lay["kurtosis_se"].fillna(0).tolist(), visible=True),
        )
    )
    threshold(fig, 1.0, "1 (every neuron the same RMS)")
    fig.update_yaxes(title_text="mean(s^4) / mean(s^2)^2", rangemode="tozero")
    fig.update_layout(title=f"Outlier features (kurtosis of neuron RMS) — {result_name(result)}")
    return integer_ticks(fig, "x", "layer (output of block)")


def sections(result: dict) -> dict:
    return sink_sections(result)


def text(result: dict) -> str:
    s = result["summary"].iloc[0].to_dict()
    if s["sink_formed"] is None or pd.isna(s["sink_formed"]):
        s["sink_formed"] = "no verdict (a number the rule reads is not finite)"
    note = linear_note(result_meta(result))
    lines = [
        header(result_meta(result)),
        *note_lines(note),
        "",
        f"summary (rows t >= 1; a sink has formed when pos0 share >= {SINK_FACTOR:g} x uniform and r0 < "
        f"{SINK_R0:g} over layers past the first):",
        summary_lines(
            s,
            (
                "pos0_share",
                "uniform_ref",
                "pos0_over_uniform",
                "phantom_share",
                "row_mass",
                *BRANCH_COLUMNS,
                "r0",
                "r0_later",
                "sink_formed",
            ),
        ),
    ]
    if len(result["by_type"]) > 1:
        lines += ["", "by layer type:", show(result["by_type"])]
    lines += [
        "",
        "per layer:",
        show(
            result["layers"],
            ["layer", "layer_type", "pos0_share", *BRANCH_COLUMNS, "uniform_ref", "phantom_share", "row_mass", "r0"]
            + ["pos0_share_key0"],
        ),
    ]
    lines += sink_eps.text_lines(result)
    if "massive_layers" in result:
        lines += massive.text_lines(result)
    if "dormant_summary" in result:
        lines += dormant.text_lines(result)
    if "entropy_layers" in result:
        lines += [
            "",
            "attention entropy per layer (Zhai et al.; rows t >= 1; nats, and normalised: 1 uniform, 0 one-hot):",
            show(
                result["entropy_layers"],
                ["layer", "layer_type", "entropy", "entropy_norm", "entropy_norm_se", "entropy_real_norm"],
            ),
        ]
        e = result["entropy_summary"].iloc[0]
        if int(e["min_head"]) >= 0:
            lines.append(
                f"lowest head: layer {int(e['min_head_layer'])} head {int(e['min_head'])}, "
                f"entropy_norm {float(e['min_head_entropy_norm']):.3g}"
            )
    if "kurtosis_layers" in result:
        lines += [
            "",
            "outlier features per layer (He et al.; kurtosis of neuron RMS after each block, 1 = all equal):",
            show(result["kurtosis_layers"], ["layer", "kurtosis", "kurtosis_se", "max_neuron", "max_over_rms"]),
        ]
    lines += norm_weighted_lines(result)
    if "register_neurons" in result:
        lines += [
            "",
            "register neurons (Jiang et al.; mean |MLP activation| at the outlier positions, best first):",
            show(result["register_neurons"], ["rank", "layer", "neuron", "score"]),
        ]
    bad = nonfinite(result)
    if bad is not None:  # the numbers above, marked; no verdict drawn from them
        lines += nonfinite_lines(bad)
        return glossed(lines, verdict(nonfinite_sentence(bad)))
    return glossed(lines, verdict(sink_sentence(s)))
