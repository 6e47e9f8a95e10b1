"""``probe sources``: effective depth sources of a depth-routed model (AttnRes, P-LR, S-LR), the dense-connection
weights of a DenseFormer / MUDD model, or the stream sources of a hyper-connected one (HC, mHC, DeepSeek-V4); shaped
for the terminal and the page by probe.present.sources."""

from __future__ import annotations

import argparse

from probe.cli.flags import DEFAULT_DEPTH_MODEL, analysis_parser, output_flags

VERB = "sources"  # this module is `probe sources` (probe.cli.main finds verbs by this line)
RANK = 50  # its place in `probe --help`
HELP = (
    "effective depth sources and mean depth heatmap of a depth-routed model; dense-connection weights of a "
    "DenseFormer / MUDD model; stream sources, mixing and BOS stream of a hyper-connected (HC / mHC) model"
)


def add_parser(sub) -> argparse.ArgumentParser:
    p = analysis_parser(sub, "sources", HELP, DEFAULT_DEPTH_MODEL)
    output_flags(p)
    return p


def _depth_routed(model) -> None:
    from probe.analyses.sources import dense_layers
    from probe.analyses.streams import has_streams
    from probe.errors import UsageError

    info = model.probe_info
    if not info.has_depth_sources and not dense_layers(model) and not has_streams(model):
        raise UsageError(
            f"model {info.name!r} has no depth routing (depth_routing={info.depth_routing!r}); "
            "`probe sources` needs an AttnRes / P-LR / S-LR model, dense connections (DenseFormer / "
            "MUDD) or hyper-connected streams (HC / mHC / DeepSeek-V4), e.g. `probe train --variant attnres-block4`"
        )


def run(args: argparse.Namespace) -> int:
    from probe.analyses.sources import dense_weights, effective_sources
    from probe.analyses.streams import has_streams, stream_sources
    from probe.cli.prepare import start
    from probe.present import sources
    from probe.present.files import publish

    run = start(args, DEFAULT_DEPTH_MODEL, "sources", check=_depth_routed)
    if run.model.probe_info.has_depth_sources:
        analysis = effective_sources
    else:
        analysis = stream_sources if has_streams(run.model) else dense_weights
    result = analysis(run.model, run.windows, progress=run.progress)
    publish(run.output, "sources", result, sources, run.console)
    return 0
