"""``probe costs``: the FLOP and parameter cost model of depth routing (LR-AttnRes 2026 Table 1) for given dimensions
or a model tier; shaped by probe.present.costs."""

from __future__ import annotations

import argparse

from probe.checkpoints.sizes import BOUNDS
from probe.cli.flags import output_flags
from probe.options import size_at_most

VERB = "costs"  # this module is `probe costs` (probe.cli.main finds verbs by this line)
RANK = 70  # its place in `probe --help`
HELP = "FLOP and parameter cost model of AttnRes / P-LR / S-LR (LR-AttnRes 2026 Table 1)"
DESCRIPTION = (
    "Added FLOPs and parameters of depth routing. Default dimensions are LR-AttnRes 2026 Table 1's "
    "(d=1024, L=24, m=2816); --tier takes them from a model tier."
)


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("costs", help=HELP, description=DESCRIPTION, allow_abbrev=False)
    p.add_argument("--tier", help="take d, L and m from a model tier (see `probe models`)")
    width = size_at_most(BOUNDS["width"], "a width")
    p.add_argument("--d", type=width, help="model width d (default 1024)")
    p.add_argument("--layers", type=size_at_most(BOUNDS["layers"], "a layer count"), help="layers L (default 24)")
    p.add_argument("--mlp", type=width, help="MLP width m (default 2816)")
    output_flags(p, reads_data=False)
    return p


def run(args: argparse.Namespace) -> int:
    import pandas as pd  # this verb's tables and figure; imported here so that `probe --help` stays light

    from probe.analyses.costs import TABLE1, cost_table
    from probe.catalogue import TIERS
    from probe.cli.flags import output_spec
    from probe.console import Console
    from probe.errors import UsageError
    from probe.present import costs
    from probe.present.files import publish

    output = output_spec(args)
    console = Console(output.quiet)
    d, L, m = 1024, 24, 2816
    if args.tier:
        if args.tier not in TIERS:
            raise UsageError(f"--tier {args.tier!r} is not a tier; choose one of {', '.join(TIERS)}")
        t = TIERS[args.tier]
        d, L, m = t["d_model"], t["n_layers"], t["d_mlp"]
    d, L, m = args.d or d, args.layers or L, args.mlp or m
    rows, skipped = [], []
    for meth, N, r, _ in TABLE1:
        if (N is not None and (2 * L) % N) or (r is not None and meth == "s-lr" and r > d):
            skipped.append(f"{meth} N={N} r={r}")
        else:
            rows.append((meth, N, r))
    table = cost_table(d, L, m, rows)
    if (d, L, m) == (1024, 24, 2816):  # the paper's printed values beside the model's
        table["table1_pct"] = [p for meth, N, r, p in TABLE1]
    meta = {"analysis": "costs", "d": d, "L": L, "m": m, "base_flops": int(table["base_flops"].iloc[0])}
    result = {"costs": table, "meta": pd.DataFrame([meta])}
    if skipped:
        console.note(f"skipped rows that do not fit L={L}, d={d}: {', '.join(skipped)}")
    publish(output, "costs", result, costs, console)
    return 0
