"""`probe gates`: its terminal text, figures, page sections and the descriptions of its files."""
from __future__ import annotations

from probe.present import figures as F
from probe.present import summaries
from probe.present.console import summary_lines
from probe.present.files import header, result_meta, show

TITLE = "Value gates"


def figures(result: dict) -> list:
    return [F.gate_figure(result)] + ([F.gate_token_table(result)] if len(result["tokens"]) else [])


def sections(result: dict) -> dict:
    return summaries.gate_sections(result)


def text(result: dict) -> str:
    meta = result_meta(result)
    min_count = meta["min_count"]
    s = result["summary"].iloc[0].to_dict()
    tokens = result["tokens"].assign(token=lambda t: t["token"].map(repr))  # show spaces and newlines
    lines = [header(meta), "", "summary:",
             summary_lines(s, ("value_gate", "mean_gate", "selectivity", "spread", "read_mean_gate",
                               "frac_below_half", "token_share", "token_share_min_count")), "",
             "per layer:", show(result["layers"])]
    cols = ["token", "token_id", "count", "mean_gate"]
    if 0 < len(tokens) <= 20:
        lines += ["", f"tokens with count >= {min_count}, most attenuated first:", show(tokens, cols)]
    elif len(tokens):
        lines += ["", f"most attenuated tokens (count >= {min_count}):", show(tokens.head(10), cols), "",
                  "least attenuated tokens:", show(tokens.tail(10).iloc[::-1], cols)]
    else:
        lines += ["", f"no token occurs {min_count} times in these windows (lower --min-count)"]
    return "\n".join(lines)
