"""`probe inject`: its terminal text, figures, page sections and the descriptions of its files."""
from __future__ import annotations

from probe.present import figures as F
from probe.present import summaries
from probe.present.files import header, result_meta, show

TITLE = "Value-noise injection"


def figures(result: dict) -> list:
    return [F.injection_figure(result)] + ([F.exposure_figure(result)] if "exposure" in result else [])


def sections(result: dict) -> dict:
    return summaries.inject_sections(result)


def text(result: dict) -> str:
    lines = [header(result_meta(result)), "", "loss increase (corrupted - clean, nats per token):",
             show(result["results"], ["junk", "cutoff", "dose", "loss_clean", "loss_corrupted", "delta"])]
    if "exposure" in result:
        lines += ["", "exposure (share of each row's attention mass, phantom included):",
                  show(result["exposure"], ["cutoff", "quiet_share", "quiet_share_se", "phantom_share",
                                            "phantom_share_se"])]
    return "\n".join(lines)
