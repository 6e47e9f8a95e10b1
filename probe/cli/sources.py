"""``probe sources``: effective depth sources of a depth-routed model (AttnRes, P-LR, S-LR); shaped for the terminal
and the page by probe.present.sources."""
from __future__ import annotations

import argparse

from probe.cli.flags import DEFAULT_DEPTH_MODEL, model_flags, output_flags

HELP = "effective depth sources and mean depth heatmap of a depth-routed model"


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("sources", help=HELP, description=HELP, allow_abbrev=False)
    model_flags(p, DEFAULT_DEPTH_MODEL)
    output_flags(p)
    return p


def run(args: argparse.Namespace) -> int:
    from probe.analyses.sources import effective_sources
    from probe.cli.distributed import all_ranks_agree
    from probe.cli.prepare import prepare
    from probe.present import sources
    from probe.present.console import plan_line
    from probe.present.errors import UsageError
    from probe.present.files import publish

    with all_ranks_agree():
        run = prepare(args, DEFAULT_DEPTH_MODEL, "sources")
        info = run.model.probe_info
        if info.depth_routing not in ("attnres", "plr", "slr"):
            raise UsageError(f"model {info.name!r} has no depth routing (depth_routing={info.depth_routing!r}); "
                             "`probe sources` needs an AttnRes / P-LR / S-LR model, e.g. `probe train --variant "
                             "attnres-block4`")
    run.console.note(plan_line("sources", run.model, run.windows))
    result = effective_sources(run.model, run.windows, progress=run.progress)
    publish(run.output, "sources", result, sources, run.console)
    return 0
