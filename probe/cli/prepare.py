"""What every analysis verb starts from: the flags as specs, then the model and its windows (with a loading bar).

Imported by a verb's run function only (it imports torch through probe.jobs.inputs)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from probe.cli.flags import model_spec, output_spec, window_spec
from probe.console import Console
from probe.jobs.inputs import check_data, load_model, windows_for
from probe.jobs.specs import WindowSpec
from probe.present.files import OutputSpec


@dataclass
class Prepared:
    """The loaded model, its windows and tokenizer, and where results go."""

    console: Console
    model: object
    windows: object  # probe.data.EvalBatches on the model's device
    tokenizer: object
    window_spec: WindowSpec
    output: OutputSpec

    @property
    def progress(self) -> bool:
        return not self.console.quiet


def prepare(args: argparse.Namespace, default: str, verb: str) -> Prepared:
    """The flags as specs, then the model and its windows, with a loading bar; fails fast on a missing data file."""
    model, windows, output = model_spec(args, default), window_spec(args), output_spec(args)
    console = Console(output.quiet)
    check_data(windows.data)
    bar = console.bar(2, f"{verb}: loading {model.name or 'the default model'}", unit="step", leave=False)
    try:
        loaded = load_model(model, console)
        bar.update()
        bar.set_description(f"{verb}: windows of {windows.data or 'the default data'}")
        eb, tok = windows_for(windows, loaded)
        bar.update()
    finally:
        bar.close()
    return Prepared(console, loaded, eb, tok, windows, output)


def start(args: argparse.Namespace, default: str, verb: str, check=None) -> Prepared:
    """``prepare`` on every rank together (under torchrun a setup failure on any rank ends every rank), then
    ``check(model)`` (a ``UsageError`` for a model the verb cannot take), then the note of the planned work."""
    from probe.cli.distributed import all_ranks_agree
    from probe.present.terminal import plan_line

    with all_ranks_agree():
        run = prepare(args, default, verb)
        if check is not None:
            check(run.model)
    run.console.note(plan_line(verb, run.model, run.windows))
    return run
