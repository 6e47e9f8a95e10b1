"""`probe sources`: its terminal text, figures, page sections and the descriptions of its files."""
from __future__ import annotations

from probe.present import figures as F
from probe.present import summaries
from probe.present.console import summary_lines
from probe.present.files import header, result_meta, show

TITLE = "Depth routing"


def figures(result: dict) -> list:
    return [F.depth_heatmap(result), F.effective_sources_figure(result)]


def sections(result: dict) -> dict:
    return summaries.source_sections(result)


def text(result: dict) -> str:
    s = result["summary"].iloc[0].to_dict()
    return "\n".join([header(result_meta(result)), "", "summary:",
                      summary_lines(s, ("mode", "n_sites", "S_src", "neff_mean", "top1_mass", "input_dependence")), "",
                      "per read site:", show(result["sites"], [c for c in result["sites"].columns
                                                               if c not in ("site_index", "n_tokens")])])
