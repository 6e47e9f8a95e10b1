"""``probe inject``: value-noise injection into the quiet value reads (loss increase) and the attention exposure to
them; shaped for the terminal and the page by probe.present.inject."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from probe.catalogue import DEFAULT_DOSES
from probe.cli.flags import DEFAULT_SINK_MODEL, analysis_parser, injection_flags, nonfinite_flag, output_flags

VERB = "inject"  # this module is `probe inject` (probe.cli.main finds verbs by this line)
RANK = 20  # its place in `probe --help`
HELP = "value-noise injection: loss increase when quiet value reads receive junk"
DESCRIPTION = (
    "Inject junk into the quiet value reads of every layer at once and report the loss increase per "
    "condition (junk x cutoff x dose), plus the attention exposure to quiet reads and to the phantom. With --out, "
    "an interrupted run (Ctrl-C, SIGTERM) keeps its finished batches in DIR/.partial/inject/, and the same command "
    "run again resumes from them."
)


def add_parser(sub) -> argparse.ArgumentParser:
    p = analysis_parser(sub, "inject", HELP, DEFAULT_SINK_MODEL, DESCRIPTION)
    injection_flags(p, "--dose", list(DEFAULT_DOSES), "dose(s) eps, finite and >= 0 (default 0.2 0.4 0.8 1.6)")
    p.add_argument("--no-exposure", action="store_true", help="skip the exposure statistics")
    nonfinite_flag(p)
    output_flags(p)
    return p


def run(args: argparse.Namespace) -> int:
    from probe.analyses.inject import conditions, dose_warning, inject
    from probe.cli.distributed import all_ranks_agree
    from probe.cli.flags import injection_spec
    from probe.cli.prepare import prepare
    from probe.console import note
    from probe.jobs.inputs import injection_plan
    from probe.present import inject as presentation
    from probe.present.files import publish
    from probe.present.terminal import plan_line

    if (warning := dose_warning(args.dose)) is not None:  # before the model loads: it runs, but says little
        note(f"probe inject: warning: --{warning}; running it as asked")
    with all_ranks_agree():
        run = prepare(args, DEFAULT_SINK_MODEL, "inject")
        model, eb, spec = run.model, run.windows, injection_spec(args)
        kinds, cutoffs, skipped = injection_plan(model, spec, run.window_spec.batch_size)
    for s in skipped:
        run.console.note(f"skipping junk {s}")
    doses = list(spec.doses)
    corrupted = [c for c in conditions(kinds, cutoffs, doses) if c[2] != 0]
    run.console.note(
        plan_line(
            "inject",
            model,
            eb,
            1 + len(corrupted),
            f"1 clean + {len(corrupted)} corrupted: {len(kinds)} junk x {len(cutoffs)} cutoff x {len(doses)} dose",
        )
    )
    state = partial_state(args, run, kinds, doses)
    try:
        result = inject(
            model,
            eb,
            junk=kinds,
            cutoffs=cutoffs,
            doses=doses,
            seed=run.window_spec.seed,
            exposure=not args.no_exposure,
            progress=run.progress,
            allow_nonfinite=args.allow_nonfinite,
            state=state,
        )
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (probe.cli.main): the finished batches stay for a rerun
        if state is not None and state.total is not None:
            sys.stderr.write(
                f"probe inject: interrupted after {len(state.done())} of {state.total} batches; "
                "rerun the same command to resume\n"
            )
            e.reported = True  # probe.cli.main writes no second line
        raise
    publish(run.output, "inject", result, presentation, run.console)
    if state is not None:
        state.remove()
    return 0


def partial_state(args: argparse.Namespace, run, kinds, doses):
    """Where an interrupted ``probe inject --out DIR`` keeps its finished batches (``probe.jobs.partial``), with the
    settings that determine the numbers (a rerun with others is refused in one line), and the note that a rerun
    resumes; None without --out, and in a data-parallel run (one process keeps partial state, not several)."""
    from probe.process_group import rank_and_world

    if not run.output.out or rank_and_world()[1] > 1:
        return None
    from probe.analyses.capture import model_device
    from probe.jobs.fingerprints import model_fingerprint
    from probe.jobs.partial import BatchState

    model = run.model
    dtype = next((str(p.dtype) for p in model.parameters()), None) if hasattr(model, "parameters") else None
    # inject() adds its own (model name, windows, conditions, cutoffs, seed, exposure, ...): probe.analyses.inject
    settings = {
        "model_fingerprint": model_fingerprint(args.model or DEFAULT_SINK_MODEL),
        "dtype": dtype,
        "device": str(model_device(model)),
        "window_spec": dataclasses.asdict(run.window_spec),
        "junk": list(kinds),
        "doses": list(doses),
    }
    state = BatchState(run.output.out, "inject", settings)
    done = state.done()
    if done:
        run.console.note(
            f"probe inject: resuming {run.output.out}: {len(done)} of {len(run.windows)} "
            f"batches already done (kept in {state.folder})"
        )
    return state
