"""``probe report``: the flags as a ``ReportSpec``, the report written by ``probe.jobs.report`` (or shard folders joined
by ``probe.jobs.shards``), its summary on stdout."""

from __future__ import annotations

import argparse

from probe.catalogue import SENSITIVITY_METHODS
from probe.cli.flags import eps_flag, folder_flags, injection_flags, mechanism_flags, model_flags, protocol_flag
from probe.options import positive_int

VERB = "report"  # this module is `probe report` (probe.cli.main finds verbs by this line)
RANK = 80  # its place in `probe --help`
HELP = "batch sink report over many models or training checkpoints (resumable)"
SAMPLES = 16  # --sensitivity sampled's Gaussian directions unless --sensitivity-samples
DESCRIPTION = (
    "Sink statistics (and optionally massive activations, attention entropy, outlier kurtosis, norm-weighted "
    "key-0 shares, the last token's sensitivity to each position, and injection) for every model or checkpoint, "
    "written as CSV and an offline HTML report, report.html, which loads the plotly.min.js written beside it (move "
    "the folder as a whole, or pass --self-contained for a page that works alone); with several --ctx lengths, "
    "every model at each, reported against T. Killed and started again with the same arguments, it continues where "
    "it stopped."
)


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("report", help=HELP, description=DESCRIPTION, allow_abbrev=False)
    g = p.add_argument_group("what to compare")
    g.add_argument("--models", nargs="+", metavar="NAME", help="model names or directories")
    g.add_argument("--checkpoints", metavar="SPEC", help="checkpoints of one model: pythia-160m@step1000,step2000,...")
    g.add_argument(
        "--shard",
        metavar="I/N",
        help="compute only shard I of N (1-based; every N-th model from the I-th): "
        "one job of a job array, e.g. --shard $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT; resumable",
    )
    g.add_argument(
        "--merge",
        nargs="+",
        metavar="DIR",
        help="join the folders of all N shards of one run into --out "
        "(computes nothing; CSV rows as an unsharded run's)",
    )
    model_flags(p, None, several_ctx=True)  # several --ctx: every model at every length, reported against T
    p.set_defaults(model=None)  # each of --models / --checkpoints in turn, never one --model
    eps_flag(p)
    protocol_flag(p)
    p.add_argument(
        "--massive",
        action="store_true",
        help="also report massive activations (Sun et al. 2024; with several --ctx, the largest against T)",
    )
    mechanism_flags(p)  # per model or checkpoint, from the same forward as the sink statistics
    sensitivity_flags(p)  # per model or checkpoint, a forward and backwards of its own on the first batch
    injection_flags(p, "--inject-doses", None, "also run injection at these doses (default: no injection)")
    p.add_argument("--out", metavar="DIR", default="probe-report", help="report directory (default probe-report)")
    p.add_argument("--json", action="store_true", help="print the summary table as JSON on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress bars or notes on stderr")
    folder_flags(p, reads_data=True)
    return p


def sensitivity_flags(p) -> None:
    """--sensitivity [METHOD] and --sensitivity-samples K: the last token's sensitivity (probe sensitivity's
    measure, the last layer) on the first batch of each model's windows."""
    p.add_argument(
        "--sensitivity",
        nargs="?",
        const="sampled",
        choices=SENSITIVITY_METHODS,
        metavar="METHOD",
        help="also report the last token's sensitivity to each position at the last layer (Barbero et al. 2024/2025) "
        "on the first batch of windows: sampled (the default; --sensitivity-samples directions) or exact (one "
        "backward per model coordinate)",
    )
    p.add_argument(
        "--sensitivity-samples",
        type=positive_int,
        default=None,  # not given: SAMPLES; given, it needs --sensitivity sampled (refused otherwise, never ignored)
        metavar="K",
        help=f"Gaussian directions of --sensitivity sampled, at least 2 (default {SAMPLES})",
    )


def sensitivity_options(args):
    """The --sensitivity flags as SensitivityOptions (None when not asked); --sensitivity-samples without the sampled
    method to take it, or too few samples, is one line."""
    from probe.analyses.sensitivity import SensitivityOptions
    from probe.errors import UsageError

    samples = args.sensitivity_samples
    if samples is not None and args.sensitivity != "sampled":
        given = (
            "without --sensitivity; add --sensitivity (sampled is its default)"
            if args.sensitivity is None
            else f"with --sensitivity {args.sensitivity}, which draws none; choose --sensitivity sampled"
        )
        raise UsageError(
            f"--sensitivity-samples {samples} needs --sensitivity sampled (its Gaussian directions), got it {given}, "
            "or leave out --sensitivity-samples"
        )
    if args.sensitivity is None:
        return None
    samples = SAMPLES if samples is None else samples
    if args.sensitivity == "sampled" and samples < 2:
        raise UsageError(f"--sensitivity-samples {samples}: the sampled method needs at least 2 (its standard error)")
    return SensitivityOptions(method=args.sensitivity, samples=samples, seed=args.seed)


def run(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from probe.cli.flags import eps_values, injection_spec, model_spec, window_spec
    from probe.console import Console
    from probe.errors import UsageError
    from probe.jobs.report import ReportSpec, expand_checkpoints, sweep_contexts, write_report
    from probe.jobs.shards import merge_reports, parse_shard
    from probe.present.report import report_text
    from probe.writes import json_safe

    console = Console(args.quiet)
    if args.merge:
        if args.models or args.checkpoints or args.shard:
            raise UsageError(
                "--merge DIR ... joins finished shard folders: give it no --models, --checkpoints or "
                "--shard (those go to the shard runs)"
            )
        tables, settings, names = merge_reports([Path(d) for d in args.merge], Path(args.out), console)
    else:
        if bool(args.models) == bool(args.checkpoints):
            raise UsageError(
                "give exactly one of --models A B ... or --checkpoints NAME@REV,REV,... "
                "(or --merge DIR ... to join shard folders)"
            )
        names = tuple(dict.fromkeys(args.models or expand_checkpoints(args.checkpoints)))
        shard = parse_shard(args.shard) if args.shard else None
        contexts = sweep_contexts(args.ctx)
        args.ctx = None if contexts or not args.ctx else args.ctx[0]  # one --ctx: a single-context report (no sweep)
        spec = ReportSpec(
            names=names,
            model=model_spec(args),
            windows=window_spec(args),
            eps=eps_values(args),
            injection=injection_spec(args),
            out=Path(args.out),
            shard=shard,
            self_contained=args.self_contained,
            contexts=contexts,
            massive=args.massive,
            entropy=args.entropy,
            kurtosis=args.kurtosis,
            norm_weighted=args.norm_weighted,
            sensitivity=sensitivity_options(args),
        )
        if spec.injection is not None:
            from probe.analyses.inject import dose_warning

            if (warning := dose_warning(spec.injection.doses)) is not None:
                console.note(f"probe report: warning: --inject-{warning.replace('dose ', 'doses ', 1)}; running them")
        try:
            tables, settings = write_report(spec, console)
        except UsageError as e:
            raise _without_missing_flag(e) from None
    if args.json:
        print(
            json.dumps(
                json_safe(
                    {
                        "settings": settings,
                        **{
                            k: v.to_dict("records")
                            for k, v in tables.items()
                            if k in ("summary", "ctx_summary", "injection", "exposure")
                        },
                    }
                ),
                indent=1,
            )
        )
        return 0
    print(report_text(tables, settings, len(names), args.shard))
    return 0


def _without_missing_flag(e):
    """A non-finite model's one line as the analyses word it suggests ``--allow-nonfinite``, which ``probe report``
    does not have (its tables and page draw verdicts): here it says that no verdict is drawn instead, suggesting only
    flags this verb has."""
    from probe.analyses.finite import FLAG
    from probe.errors import UsageError

    suffix = f"; pass {FLAG} to report the numbers without a verdict"
    text = str(e)
    if not text.endswith(suffix):
        return e
    return UsageError(f"{text[: -len(suffix)]}; no verdict is drawn from numbers that are not finite", prog=e.prog)
