"""``probe eval``: next-token loss and perplexity on evaluation windows; shaped for the terminal and the page by
probe.present.eval."""

from __future__ import annotations

import argparse

from probe.cli.flags import DEFAULT_MODEL, analysis_parser, output_flags

VERB = "eval"  # this module is `probe eval` (probe.cli.main finds verbs by this line)
RANK = 120  # its place in `probe --help`
HELP = "next-token loss and perplexity on evaluation windows"


def add_parser(sub) -> argparse.ArgumentParser:
    p = analysis_parser(sub, "eval", HELP, DEFAULT_MODEL)
    output_flags(p)
    return p


def run(args: argparse.Namespace) -> int:
    import math

    import pandas as pd

    from probe.analyses.capture import as_windows, describe, finish, window_losses
    from probe.cli.prepare import start
    from probe.present import eval as presentation
    from probe.present.files import publish

    run = start(args, DEFAULT_MODEL, "eval")
    model, eb = run.model, run.windows
    windows = window_losses(model, eb, progress=run.progress)  # under torchrun: every rank's rows, gathered
    loss = float(windows["loss_sum"].sum() / windows["n_tokens"].sum())
    summary = pd.DataFrame(
        [
            {
                "loss": loss,
                "perplexity": math.exp(loss),
                "n_tokens": int(windows["n_tokens"].sum()),
                "n_windows": len(windows),
            }
        ]
    )
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")  # the weights' (--dtype moves the loss)
    result = finish({"summary": summary, "windows": windows}, describe(model, as_windows(eb), "eval", dtype=dtype))
    publish(run.output, "eval", result, presentation, run.console)
    return 0
