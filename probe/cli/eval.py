"""``probe eval``: next-token loss and perplexity on evaluation windows; shaped for the terminal and the page by
probe.present.eval."""
from __future__ import annotations

import argparse

from probe.cli.flags import DEFAULT_MODEL, model_flags, output_flags

HELP = "next-token loss and perplexity on evaluation windows"


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("eval", help=HELP, description=HELP, allow_abbrev=False)
    model_flags(p, DEFAULT_MODEL)
    output_flags(p)
    return p


def run(args: argparse.Namespace) -> int:
    import math

    import pandas as pd
    import torch

    from probe.analyses.capture import as_windows, describe, finish, loss_forward_kwargs, output_losses
    from probe.analyses.parallel import batches_of_rank, gather_rows
    from probe.cli.distributed import all_ranks_agree
    from probe.cli.prepare import prepare
    from probe.present import eval as presentation
    from probe.present.console import plan_line
    from probe.present.files import publish

    with all_ranks_agree():
        run = prepare(args, DEFAULT_MODEL, "eval")
    model, eb = run.model, run.windows
    run.console.note(plan_line("eval", model, eb))
    rows, mine = [], batches_of_rank(len(eb))  # under torchrun: this rank's batches; all rows gathered below
    bar = run.console.bar(len(mine), "eval", unit="batch")
    with torch.no_grad():
        for n in mine:
            window = eb.tokens[n]
            out = model(window[:, :-1], **loss_forward_kwargs(model))
            losses = output_losses(model, out, window[:, 1:]).double()
            for b in range(window.shape[0]):
                rows.append({"batch": n, "row": b, "doc_id": int(eb.doc_ids[n, b]), "loss_sum": float(losses[b].sum()),
                             "n_tokens": losses.shape[1], "loss": float(losses[b].mean())})
            bar.update()
    bar.close()
    windows = pd.DataFrame(gather_rows(rows))
    loss = float(windows["loss_sum"].sum() / windows["n_tokens"].sum())
    summary = pd.DataFrame([{"loss": loss, "perplexity": math.exp(loss), "n_tokens": int(windows["n_tokens"].sum()),
                             "n_windows": len(windows)}])
    result = finish({"summary": summary, "windows": windows}, describe(model, as_windows(eb), "eval"))
    publish(run.output, "eval", result, presentation, run.console)
    return 0
