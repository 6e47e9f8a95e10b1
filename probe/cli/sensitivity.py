"""``probe sensitivity``: how much the last token's representation depends on each input embedding (over-squashing and
over-mixing, Barbero et al. 2024 and 2025), and with ``--collapse`` the representational collapse of repeated-token
pairs over lengths in float32 and bfloat16; shaped for the terminal and the page by probe.present.sensitivity."""

from __future__ import annotations

import argparse

from probe.catalogue import COLLAPSE_MODES, SENSITIVITY_DEPTHS, SENSITIVITY_METHODS
from probe.cli.flags import DEFAULT_MODEL, analysis_parser, output_flags
from probe.options import nonneg_int, positive_int

VERB = "sensitivity"  # this module is `probe sensitivity` (probe.cli.main finds verbs by this line)
RANK = 75  # its place in `probe --help`
HELP = "sensitivity of the last token to each input position (over-squashing) and representational collapse"
COLLAPSE_TEXT = ("1", "0")  # the paper's prompts: a run of "1" closed by a "0"


def add_parser(sub) -> argparse.ArgumentParser:
    p = analysis_parser(sub, VERB, HELP, DEFAULT_MODEL)
    g = p.add_argument_group("sensitivity")
    g.add_argument(
        "--method",
        choices=SENSITIVITY_METHODS,
        default="exact",
        help="exact: one backward per model coordinate; sampled: --samples Gaussian directions (default exact)",
    )
    g.add_argument("--samples", type=positive_int, default=16, help="directions of the sampled method (default 16)")
    g.add_argument(
        "--depth", choices=SENSITIVITY_DEPTHS, default="last", help="the last layer's output or every layer's"
    )
    g.add_argument(
        "--collapse",
        nargs="+",
        type=positive_int,
        metavar="N",
        help="also measure representational collapse at these sequence lengths (float32 and bfloat16)",
    )
    g.add_argument(
        "--collapse-mode",
        choices=COLLAPSE_MODES,
        default="ones",
        help="ones: 1…1 0 with one more 1; repeat-last: the sequence with its last token once more (default ones)",
    )
    g.add_argument(
        "--collapse-ids",
        nargs=2,
        type=nonneg_int,
        metavar=("REPEATED", "LAST"),
        help="token ids of the repeated token and the last one (default: the tokenizer's '1' and '0')",
    )
    output_flags(p)
    return p


def _collapse_ids(args, tokenizer) -> tuple[int, int]:
    if args.collapse_ids:
        return args.collapse_ids[0], args.collapse_ids[1]
    ids = [tokenizer.encode(text, add_special_tokens=False) for text in COLLAPSE_TEXT]
    return ids[0][-1], ids[1][-1]


def _check_lengths(args, model) -> None:
    from probe.errors import UsageError

    longest = model.probe_info.n_ctx - 1  # s' is one token longer than s
    if args.collapse and max(args.collapse) > longest:
        raise UsageError(f"--collapse {max(args.collapse)}: lengths up to {longest} (the model's context - 1)")


def run(args: argparse.Namespace) -> int:
    from probe.analyses.collapse import collapse
    from probe.analyses.sensitivity import SensitivityOptions, sensitivity
    from probe.cli.prepare import start
    from probe.errors import UsageError
    from probe.present import sensitivity as presentation
    from probe.present.files import publish

    if args.method == "sampled" and args.samples < 2:
        raise UsageError(f"--samples {args.samples}: the sampled method needs at least 2 (its standard error)")
    run = start(args, DEFAULT_MODEL, VERB, check=lambda model: _check_lengths(args, model))
    options = SensitivityOptions(method=args.method, samples=args.samples, layers=args.depth, seed=args.seed)
    result = sensitivity(run.model, run.windows, options, progress=run.progress)
    if args.collapse:
        repeated, last = _collapse_ids(args, run.tokenizer)
        found = collapse(run.model, args.collapse, repeated, last, mode=args.collapse_mode)
        for k in ("summary", "lengths"):
            result[f"collapse_{k}"] = found[k]
    publish(run.output, VERB, result, presentation, run.console)
    return 0
