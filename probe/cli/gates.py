"""``probe gates``: gate statistics (mean gate, selectivity, per-token gates) of a model with a value gate or an output
gate; shaped for the terminal and the page by probe.present.gates."""

from __future__ import annotations

import argparse

from probe.cli.flags import DEFAULT_MODEL, analysis_parser, output_flags
from probe.options import positive_int

VERB = "gates"  # this module is `probe gates` (probe.cli.main finds verbs by this line)
RANK = 60  # its place in `probe --help`
HELP = "gate statistics (value or output gates): mean gate, selectivity, per-token gates"


def add_parser(sub) -> argparse.ArgumentParser:
    p = analysis_parser(sub, "gates", HELP, DEFAULT_MODEL)
    p.add_argument(
        "--min-count", type=positive_int, default=50, help="minimum occurrences for the token table (default 50)"
    )
    output_flags(p)
    return p


def _gated(model) -> None:
    from probe.errors import UsageError

    info = model.probe_info
    if not info.has_value_gate and not info.has_out_gate:
        raise UsageError(
            f"model {info.name!r} has no value gate or output gate; `probe gates` needs a gated model (normgate, "
            "projgate, sink+norm, sink+proj, routing-normgate, gatedv, g2, glu-..., outgate, outgate-head)"
        )


def run(args: argparse.Namespace) -> int:
    from probe.analyses.gates import gate_stats
    from probe.cli.prepare import start
    from probe.present import gates
    from probe.present.files import publish

    run = start(args, DEFAULT_MODEL, "gates", check=_gated)
    result = gate_stats(
        run.model, run.windows, min_count=args.min_count, tokenizer=run.tokenizer, progress=run.progress
    )
    publish(run.output, "gates", result, gates, run.console)
    return 0
