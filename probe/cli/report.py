"""``probe report``: the flags as a ``ReportSpec``, the report written by ``probe.report``, its summary on stdout."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from probe.cli.specs import eps_values, injection_spec, model_spec, window_spec
from probe.console import Console
from probe.errors import UsageError
from probe.output import clean, show
from probe.report import ReportSpec, expand_checkpoints, write_report


def run_report(args: argparse.Namespace) -> int:
    console = Console(args.quiet)
    if bool(args.models) == bool(args.checkpoints):
        raise UsageError("give exactly one of --models A B ... or --checkpoints NAME@REV,REV,...")
    names = tuple(dict.fromkeys(args.models or expand_checkpoints(args.checkpoints)))
    spec = ReportSpec(names=names, model=model_spec(args), windows=window_spec(args), eps=eps_values(args),
                      injection=injection_spec(args), out=Path(args.out))
    tables, settings = write_report(spec, console)
    if args.json:
        print(json.dumps(clean({"settings": settings, **{k: v.to_dict("records") for k, v in tables.items()
                                                         if k in ("summary", "injection", "exposure")}}), indent=1))
        return 0
    w = spec.windows
    text = [f"sink report: {len(names)} models, {settings['data']}, {w.batches} x {w.batch_size} windows",
            show(tables["summary"], ["model", "step", "pos0_share", "uniform_ref", "pos0_over_uniform",
                                     "phantom_share", "r0", "r0_later", "sink_formed"], identity=True)]
    if "injection" in tables:
        text += ["", "injection (loss increase, nats per token):",
                 show(tables["injection"], ["model", "step", "junk", "cutoff", "dose", "loss_clean", "delta"],
                      identity=True)]
    print("\n".join(text))
    return 0
