"""``probe gates``: value-gate statistics (mean gate, selectivity, per-token gates) of a gated model; shaped for the
terminal and the page by probe.present.gates."""
from __future__ import annotations

import argparse

from probe.cli.flags import DEFAULT_MODEL, model_flags, output_flags
from probe.present.options import positive_int

HELP = "value-gate statistics: mean gate, selectivity, per-token gates"


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("gates", help=HELP, description=HELP, allow_abbrev=False)
    model_flags(p, DEFAULT_MODEL)
    p.add_argument("--min-count", type=positive_int, default=50, help="minimum occurrences for the token table "
                   "(default 50)")
    output_flags(p)
    return p


def run(args: argparse.Namespace) -> int:
    from probe.analyses.gates import gate_stats
    from probe.cli.distributed import all_ranks_agree
    from probe.cli.prepare import prepare
    from probe.present import gates
    from probe.present.console import plan_line
    from probe.present.errors import UsageError
    from probe.present.files import publish

    with all_ranks_agree():
        run = prepare(args, DEFAULT_MODEL, "gates")
        info = run.model.probe_info
        if info.value_gate == "none":
            raise UsageError(f"model {info.name!r} has no value gate; `probe gates` needs a gated model (normgate, "
                             "projgate, sink+norm, sink+proj, routing-normgate, gatedv, g2, glu-...)")
    run.console.note(plan_line("gates", run.model, run.windows))
    result = gate_stats(run.model, run.windows, min_count=args.min_count, tokenizer=run.tokenizer,
                        progress=run.progress)
    publish(run.output, "gates", result, gates, run.console)
    return 0
