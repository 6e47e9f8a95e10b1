"""`probe eval`: its terminal text, figure, page sections and the descriptions of its files."""
from __future__ import annotations

import plotly.graph_objects as go

from probe.present import summaries
from probe.present.console import summary_lines
from probe.present.files import header, result_meta

TITLE = "Evaluation"


def figures(result: dict) -> list:
    windows = result["windows"]
    fig = go.Figure(go.Bar(x=list(range(len(windows))), y=windows["loss"], text=windows["doc_id"]))
    fig.update_layout(title=f"Mean next-token loss per window — {result_meta(result)['model']}",
                      xaxis_title="window", yaxis_title="loss (nats)")
    return [fig]


def sections(result: dict) -> dict:
    return summaries.eval_sections(result)


def text(result: dict) -> str:
    return "\n".join([header(result_meta(result)), "", summary_lines(result["summary"].iloc[0].to_dict(),
                                                                     ("loss", "perplexity", "n_tokens", "n_windows"))])
