"""The ``probe`` command: analyses of attention routing from the shell.

    probe models                                    variants, tiers, zoo and known checkpoint names
    probe sinks   [--model M] [--data D]            attention-sink statistics
    probe inject  --junk structured --dose 0.4      value-noise injection (loss increase) and exposure
    probe sources --model DIR                       effective depth sources of a depth-routed model
    probe gates   [--model M]                       value-gate selectivity and per-token gates
    probe costs   [--tier T | --d --layers --mlp]   FLOP / parameter cost model of depth routing
    probe report  --models A B | --checkpoints pythia-160m@step1000,step2000   batch sink report (resumable)
    probe train   --variant V --tier T --out DIR    train a custom model (same command resumes)
    probe eval    --model DIR                       next-token loss and perplexity
    probe view    --text "..." --out DIR            attention (any layer, head), depth weights, gates of one text
    probe experiment NAME --out DIR                 a paper's experiment recipe (probe experiment --list)

``probe.cli.parser`` defines the flags; ``VERBS`` below maps each verb to the function that runs it, in one module per
verb family (``analyses``: sinks, inject, sources, gates, eval; ``catalogue``: models, costs; ``train``; ``report``;
``view``).
Every user error (unknown verb, flag, model, junk type, cutoff; a bad dose, count or context; a missing data file; an
unreadable checkpoint) is one line on stderr and exit code 2, before any output file is written.
"""
from __future__ import annotations

import os
import sys
import time
from importlib import import_module

from probe.cli.parser import build_parser, check_unknown
from probe.present.errors import UsageError

# verb -> the function that runs it (argparse.Namespace -> exit code). The verb modules import torch, transformers and
# pandas at their top, so each is imported only when its verb runs: `probe --help` stays under a second.
VERBS = {
    "models": lambda args: import_module("probe.cli.catalogue").run_models(args),
    "costs": lambda args: import_module("probe.cli.catalogue").run_costs(args),
    "sinks": lambda args: import_module("probe.cli.analyses").run_sinks(args),
    "inject": lambda args: import_module("probe.cli.analyses").run_inject(args),
    "sources": lambda args: import_module("probe.cli.analyses").run_sources(args),
    "gates": lambda args: import_module("probe.cli.analyses").run_gates(args),
    "eval": lambda args: import_module("probe.cli.analyses").run_eval(args),
    "train": lambda args: import_module("probe.cli.train").run_train(args),
    "report": lambda args: import_module("probe.cli.report").run_report(args),
    "view": lambda args: import_module("probe.cli.view").run_view(args),
}


def under_torchrun() -> bool:
    """One of several processes started by torchrun (probe.cli.distributed runs the verb in their process group)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


RANK0_GRACE_S = 5.0


def _in_process_group() -> bool:
    """A torch.distributed group is up (never without importing torch, which the flag parser does not)."""
    dist = sys.modules.get("torch.distributed")
    return dist is not None and dist.is_available() and dist.is_initialized()


def run_experiment(argv: list[str]) -> int:
    """``probe experiment NAME ...``: the recipes parse their own options (one config dataclass per recipe)."""
    return import_module("probe.experiments.command").main(argv, prog="probe experiment")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["experiment"]:
        return run_experiment(argv[1:])
    verb = None
    try:
        parser = build_parser()
        args, extra = parser.parse_known_args(argv)
        check_unknown(parser, args, extra)
        if args.verb is None:
            raise UsageError(f"missing VERB; choose one of {', '.join([*VERBS, 'experiment'])}", prog="probe")
        verb = args.verb
        if under_torchrun() and verb != "train":  # the trainer joins its process group itself
            return import_module("probe.cli.distributed").run_on_ranks(VERBS[verb], args) or 0
        # before any model loads: a bad --out is one line within a second (under torchrun rank 0, the one writer,
        # alone checks: ranks creating and removing the same test folders at once would race)
        if getattr(args, "out", None) and os.environ.get("RANK", "0") == "0":
            import_module("probe.present.files").check_out_dir(args.out, prog=f"probe {verb}")
        return VERBS[verb](args) or 0
    except UsageError as e:
        if os.environ.get("PROBE_TRACEBACK"):
            raise
        if under_torchrun() and os.environ.get("RANK", "0") != "0" and not getattr(e, "rank_local", False):
            # every rank met this error (same flags, or shared by probe.cli.distributed): rank 0 prints it
            if not _in_process_group():
                # torchrun ends every rank at the first non-zero exit; before the ranks share a group nothing makes
                # rank 0 print first, so this rank gives it time (torchrun stops this rank when rank 0 exits)
                time.sleep(RANK0_GRACE_S)
            return 2
        prog = f"probe {verb}" if e.prog == "probe" and verb else e.prog
        sys.stderr.write(f"{prog}: error: {e.one_line()}\n")
        return 2
    except BrokenPipeError:  # stdout closed early (e.g. `| head`): not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("probe: interrupted\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
