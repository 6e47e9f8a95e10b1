"""`probe eval`: its terminal text, figure, page sections and the descriptions of its files."""

from __future__ import annotations

import plotly.graph_objects as go

from probe.present.files import header, result_meta
from probe.present.glossary import glossed
from probe.present.sections import drop_ids, se_caveat
from probe.present.terminal import summary_lines, verdict

# One line on each file of this analysis an output folder may hold (probe.present.page's index.html shows them)
DESCRIPTIONS = {
    "eval.html": "next-token loss and perplexity, per window",
    "eval.json": "evaluation: every table and the run's settings (JSON)",
    "eval_summary.csv": "mean next-token loss and perplexity",
    "eval_windows.csv": "summed and mean loss per evaluation window",
}


def eval_sections(result: dict) -> dict:
    """Evaluation: loss ± s.e. over windows; summary and per-window tables."""
    s, w = result["summary"].iloc[0], result["windows"]
    se = float(w["loss"].sem()) if len(w) > 1 else float("nan")
    verdicts = [
        f"loss {s['loss']:.4g} ± {se:.2g} nats per token (mean ± s.e. over {len(w)} windows), "
        f"perplexity {s['perplexity']:.4g}"
    ]
    summary = drop_ids(result["summary"]).assign(loss_se=se)
    return {
        "verdicts": verdicts,
        "caveats": se_caveat(len(w), "windows"),
        "tables": [("Summary", summary), ("Per window", drop_ids(w))],
    }


TITLE = "Evaluation"


def figures(result: dict) -> list:
    windows = result["windows"]
    fig = go.Figure(go.Bar(x=list(range(len(windows))), y=windows["loss"], text=windows["doc_id"]))
    fig.update_layout(
        title=f"Mean next-token loss per window — {result_meta(result)['model']}",
        xaxis_title="window",
        yaxis_title="loss (nats)",
    )
    return [fig]


def sections(result: dict) -> dict:
    return eval_sections(result)


def text(result: dict) -> str:
    return glossed(
        [
            header(result_meta(result)),
            "",
            summary_lines(result["summary"].iloc[0].to_dict(), ("loss", "perplexity", "n_tokens", "n_windows")),
        ],
        verdict(*eval_sections(result)["verdicts"]),
    )
