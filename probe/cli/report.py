"""``probe report``: the flags as a ``ReportSpec``, the report written by ``probe.jobs.report`` (or shard folders joined by
``probe.jobs.shards``), its summary on stdout."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from probe.cli.specs import eps_values, injection_spec, model_spec, window_spec
from probe.present.console import Console
from probe.present.errors import UsageError
from probe.present.files import clean, show
from probe.jobs.report import ReportSpec, expand_checkpoints, write_report
from probe.jobs.shards import merge_reports, parse_shard


def run_report(args: argparse.Namespace) -> int:
    console = Console(args.quiet)
    if args.merge:
        if args.models or args.checkpoints or args.shard:
            raise UsageError("--merge DIR ... joins finished shard folders: give it no --models, --checkpoints or "
                             "--shard (those go to the shard runs)")
        tables, settings, names = merge_reports([Path(d) for d in args.merge], Path(args.out), console)
    else:
        if bool(args.models) == bool(args.checkpoints):
            raise UsageError("give exactly one of --models A B ... or --checkpoints NAME@REV,REV,... "
                             "(or --merge DIR ... to join shard folders)")
        names = tuple(dict.fromkeys(args.models or expand_checkpoints(args.checkpoints)))
        shard = parse_shard(args.shard) if args.shard else None
        spec = ReportSpec(names=names, model=model_spec(args), windows=window_spec(args), eps=eps_values(args),
                          injection=injection_spec(args), out=Path(args.out), shard=shard,
                          self_contained=args.self_contained)
        tables, settings = write_report(spec, console)
    if args.json:
        print(json.dumps(clean({"settings": settings, **{k: v.to_dict("records") for k, v in tables.items()
                                                         if k in ("summary", "injection", "exposure")}}), indent=1))
        return 0
    share = f"{len(names)} models"
    if args.shard:
        share = f"shard {args.shard.strip()}, {len(tables.get('summary', ()))} of {len(names)} models"
    if not tables:  # more shards than models: the folder's manifest is all the merge needs
        print(f"sink report: {share}")
        return 0
    data = settings["data"] or "each model's default data"  # None: wikitext-2-test, a BB model's own chain
    text = [f"sink report: {share}, {data}, {settings['batches']} x {settings['batch_size']} windows",
            show(tables["summary"], ["model", "step", "pos0_share", "uniform_ref", "pos0_over_uniform",
                                     "phantom_share", "r0", "r0_later", "sink_formed"], identity=True)]
    if "injection" in tables:
        text += ["", "injection (loss increase, nats per token):",
                 show(tables["injection"], ["model", "step", "junk", "cutoff", "dose", "loss_clean", "delta"],
                      identity=True)]
    print("\n".join(text))
    return 0
