"""``probe sinks``: attention-sink statistics and Sink^eps, with massive activations (--massive), active /
dormant heads per input domain (--dormant), attention entropy per head (--entropy), outlier-feature kurtosis per
layer (--kurtosis) and key 0's share by weight and by norm (--norm-weighted) when asked; shaped for the terminal and
the page by probe.present.sinks."""

from __future__ import annotations

import argparse

from probe.cli.flags import (
    DEFAULT_MODEL,
    analysis_parser,
    eps_flag,
    mechanism_flags,
    nonfinite_flag,
    output_flags,
    protocol_flag,
)
from probe.options import positive_float, positive_int

VERB = "sinks"  # this module is `probe sinks` (probe.cli.main finds verbs by this line)
RANK = 40  # its place in `probe --help`
HELP = "attention-sink statistics: position-0 share, phantom share, r0, Sink^eps"


def add_parser(sub) -> argparse.ArgumentParser:
    p = analysis_parser(sub, "sinks", HELP, DEFAULT_MODEL, several_ctx=True)
    eps_flag(p)
    protocol_flag(p)
    p.add_argument("--massive", action="store_true", help="also report massive activations (Sun et al. 2024)")
    p.add_argument(
        "--dormant", action="store_true", help="also report active/dormant heads per input domain (Guo et al. 2024)"
    )
    p.add_argument(
        "--dormant-corpora",
        nargs="+",
        default=["wikitext-2-test", "shakespeare", "kjv"],
        metavar="CORPUS",
        help="input domains for --dormant (default: the three bundled corpora)",
    )
    mechanism_flags(p)
    p.add_argument(
        "--register-neurons",
        type=positive_int,
        default=None,
        metavar="K",
        help="also report the K top register neurons (Jiang et al. 2025: MLP neurons large at the high-norm "
        "positions; one more forward per batch)",
    )
    p.add_argument(
        "--register-norm-ratio",
        type=positive_float,
        default=10.0,
        metavar="R",
        help="--register-neurons: a high-norm position's norm at the last block exceeds R x the window's median "
        "(default 10)",
    )
    p.add_argument(
        "--register-at-sink",
        action="store_true",
        help="--register-neurons: score the neurons at position 0 (the sink) in every window instead of at the "
        "high-norm positions",
    )
    nonfinite_flag(p)
    output_flags(p)
    return p


def _dormant_domains(args: argparse.Namespace, run) -> dict:
    """--dormant's input domains as windows of the run's settings, built before any work (a bad domain is one line
    naming --dormant-corpora, not --data)."""
    import dataclasses

    from probe.data.synthetic import is_synthetic
    from probe.errors import UsageError
    from probe.jobs.inputs import text_on_bb, trained_task, windows_for

    domains, task = {}, trained_task(run.model)
    for corpus in dict.fromkeys(args.dormant_corpora):
        if task is not None and not is_synthetic(corpus):
            raise text_on_bb(
                f"--dormant-corpora {corpus!r}",
                run.model,
                task,
                "give Bigram-Backcopy domains, e.g. --dormant-corpora synthetic:bb synthetic:bb[seed=1]",
            )
        try:
            domains[corpus] = windows_for(dataclasses.replace(run.window_spec, data=corpus), run.model)[0]
        except UsageError as e:
            why = e.one_line().removeprefix(f"--data {corpus!r}: ")
            raise UsageError(f"--dormant-corpora {corpus!r}: {why}") from None
    return domains


def run(args: argparse.Namespace) -> int:
    contexts = list(dict.fromkeys(args.ctx)) if args.ctx else [None]
    if len(contexts) > 1:
        return run_sweep(args, contexts)
    args.ctx = contexts[0]  # one context: the single-context run and its files (no sweep folder)
    from probe.analyses.register_neurons import RegisterOptions
    from probe.analyses.sink_pass import sink_analyses
    from probe.cli.distributed import all_ranks_agree
    from probe.cli.flags import eps_values
    from probe.cli.prepare import prepare
    from probe.present import sinks
    from probe.present.files import publish
    from probe.present.terminal import plan_line

    with all_ranks_agree():  # under torchrun: a setup failure on any rank ends every rank
        run = prepare(args, DEFAULT_MODEL, "sinks")
        domains = _dormant_domains(args, run) if args.dormant else None
    model, eb = run.model, run.windows
    run.console.note(plan_line("sinks", model, eb))
    found = sink_analyses(
        model,
        eb,
        eps=list(eps_values(args)),
        massive=args.massive,
        dormant=domains,
        tokenizer=run.tokenizer,
        progress=run.progress,  # one forward per batch for all of them
        protocol=args.protocol,
        allow_nonfinite=args.allow_nonfinite,
        entropy=args.entropy,
        kurtosis=args.kurtosis,
        norm_weighted=args.norm_weighted,
    )
    result = found["sinks"]
    for name, asked, keys in (  # each companion's tables, named by its prefix (the result files' names)
        ("sink_eps", True, ("summary", "layers", "heads")),
        ("massive", args.massive, ("summary", "layers", "top", "dims")),
        ("dormant", args.dormant, ("summary", "domains", "heads", "switching")),
        ("entropy", args.entropy, ("summary", "layers", "heads", "batches")),
        ("kurtosis", args.kurtosis, ("summary", "layers", "batches")),
        ("norm_weighted", args.norm_weighted, ("summary", "layers", "heads", "batches")),
    ):
        if asked:
            result.update({f"{name}_{k}": found[name][k] for k in keys})
    if args.register_neurons:
        opts = RegisterOptions(
            top_k=args.register_neurons, norm_ratio=args.register_norm_ratio, sink_position=args.register_at_sink
        )
        result["register_neurons"] = _register_neurons(model, eb, opts)
    publish(
        run.output,
        "sinks",
        result,
        sinks,
        run.console,
        figure_inputs={"dormant_result": found["dormant"]} if args.dormant else None,
    )
    return 0


def _register_neurons(model, windows, opts):
    """The top register neurons (probe.analyses.register_neurons) as ``opts`` asks; a model without them is one
    line."""
    from probe.analyses.register_neurons import register_neurons
    from probe.errors import UsageError

    try:
        return register_neurons(model, windows, opts)["neurons"]
    except ValueError as e:
        raise UsageError(str(e)) from None


def run_sweep(args: argparse.Namespace, contexts: list[int]) -> int:
    """--ctx with several lengths: the same analyses at each T (the model loaded once, every context's windows built
    before any work), reported against T (probe.analyses.context_sweep; files sinks_ctx_*)."""
    import dataclasses

    from probe.analyses.context_sweep import sink_context_sweep
    from probe.cli.distributed import all_ranks_agree
    from probe.cli.flags import eps_values
    from probe.cli.prepare import prepare
    from probe.errors import UsageError
    from probe.jobs.inputs import windows_for
    from probe.present import sinks_ctx
    from probe.present.files import publish
    from probe.present.terminal import plan_line

    if args.allow_nonfinite:
        raise UsageError(
            f"--allow-nonfinite takes one --ctx, got {len(contexts)} ({' '.join(map(str, contexts))}); "
            "give one length (the sweep draws no verdict of its own to withhold)"
        )
    if args.dormant:
        raise UsageError(
            f"--dormant takes one --ctx, got {len(contexts)} ({' '.join(map(str, contexts))}); "
            "give one length, or leave out --dormant"
        )
    for flag in ("entropy", "kurtosis", "norm_weighted", "register_neurons"):
        if getattr(args, flag, False):
            shown = "--" + flag.replace("_", "-")
            raise UsageError(
                f"{shown} takes one --ctx, got {len(contexts)} ({' '.join(map(str, contexts))}); "
                f"give one length, or leave out {shown}"
            )
    contexts = sorted(contexts)
    args.ctx = contexts[0]
    with all_ranks_agree():
        run = prepare(args, DEFAULT_MODEL, "sinks")
        windows = {contexts[0]: run.windows}
        for ctx in contexts[1:]:
            try:
                windows[ctx] = windows_for(dataclasses.replace(run.window_spec, ctx=ctx), run.model)[0]
            except UsageError as e:
                raise UsageError(f"--ctx {ctx}: {e.one_line()}") from None
    for eb in windows.values():
        run.console.note(plan_line("sinks", run.model, eb))
    kw = {"protocol": args.protocol} if getattr(args, "protocol", "pooled") != "pooled" else {}
    result, _ = sink_context_sweep(
        run.model,
        windows,
        eps=list(eps_values(args)),
        massive=args.massive,
        tokenizer=run.tokenizer,
        progress=run.progress,
        **kw,
    )
    publish(run.output, "sinks_ctx", result, sinks_ctx, run.console)
    return 0
