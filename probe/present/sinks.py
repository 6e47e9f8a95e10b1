"""`probe sinks`: its terminal text, figures, page sections and the descriptions of its files. Sink^eps, massive
activations and dormant heads (parts of the same verb) have their own modules; this one puts them together."""
from __future__ import annotations

from probe.analyses.sinks import SINK_FACTOR, SINK_R0
from probe.present import dormant, massive, sink_eps
from probe.present import figures as F
from probe.present import summaries
from probe.present.console import summary_lines
from probe.present.files import header, result_meta, show

TITLE = "Attention sinks"


def figures(result: dict) -> list:
    out = [F.sink_figure(result), F.sink_heads_figure(result, "pos0_share"), F.sink_heads_figure(result, "r0"),
           sink_eps.sink_eps_figure(sink_eps.part(result))]
    if "massive_layers" in result:
        out.append(massive.massive_figure(massive.part(result)))
    if "dormant_summary" in result:
        out += [dormant.dormant_figure(dormant.part(result)), dormant.dormant_heads_figure(dormant.part(result))]
    return out


def sections(result: dict) -> dict:
    return summaries.sink_sections(result)


def text(result: dict) -> str:
    s = result["summary"].iloc[0].to_dict()
    lines = [header(result_meta(result)), "",
             f"summary (rows t >= 1; a sink has formed when pos0 share >= {SINK_FACTOR:g} x uniform and r0 < "
             f"{SINK_R0:g} over layers past the first):",
             summary_lines(s, ("pos0_share", "uniform_ref", "pos0_over_uniform", "phantom_share", "r0", "r0_later",
                               "sink_formed"))]
    if len(result["by_type"]) > 1:
        lines += ["", "by layer type:", show(result["by_type"])]
    lines += ["", "per layer:", show(result["layers"], ["layer", "layer_type", "pos0_share", "uniform_ref",
                                                        "phantom_share", "r0", "pos0_share_key0"])]
    lines += sink_eps.text_lines(result)
    if "massive_layers" in result:
        lines += massive.text_lines(result)
    if "dormant_summary" in result:
        lines += dormant.text_lines(result)
    return "\n".join(lines)
