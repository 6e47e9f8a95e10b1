"""``probe ablate``: causal interventions on sinks, phantoms, gates and depth routes (key-0 knockout, position-0
value ablation, phantom edits, gate clamps, window eviction, depth-route forcings), as loss changes over the same
windows; shaped for the terminal and the page by probe.present.ablate."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from probe.cli.flags import DEFAULT_MODEL, analysis_parser, output_flags
from probe.declared import registered
from probe.options import nonneg_int, positive_int

# the interventions' names, read from their modules' source in registration order (torch is not imported for --help)
INTERVENTIONS = registered(Path(__file__).parents[1] / "analyses" / "interventions", "register_intervention")
# mirrored from probe.analyses.ablate (kept light here; tests/analyses/test_ablate_cli.py checks they agree)
VALUE_MODES = ("zero", "mean", "swap")
GATE_MODES = ("open", "closed", "mean")
DEPTH_MODES = ("uniform", "residual", "drop")
POSITIONS = ("original", "cache")
REGISTER_PLACES = ("start", "end")
DEFAULT_INTERVENTIONS = ("knockout", "value")

VERB = "ablate"  # this module is `probe ablate` (probe.cli.main finds verbs by this line)
RANK = 30  # its place in `probe --help`
HELP = "causal interventions: loss change when the sink, the phantom, a gate or a depth route is ablated"
DESCRIPTION = (
    "Ablate key 0 (knockout), position 0's value, the phantom, the value gates, the first keys under a "
    "sliding window (StreamingLLM eviction) or the depth routes, or move the register neurons onto a test-time "
    "register token (Jiang et al. 2025), on every layer at once and one layer at "
    "a time, and report the loss change per token (ablated - clean, paired on the same windows, with "
    "standard errors over batches)."
)


MAX_SINK_LOGIT = 1e4  # mirrored from probe.analyses.ablate (tests/analyses/test_ablate_cli.py checks they agree)


def sink_logit(text: str) -> float:
    """An argparse type: a phantom logit, finite and within +-MAX_SINK_LOGIT (beyond it the softmax is that of an
    infinite logit in every dtype, and fp16 cannot hold it), else one line."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or abs(value) > MAX_SINK_LOGIT:
        raise argparse.ArgumentTypeError(
            f"expected a finite logit within +-{MAX_SINK_LOGIT:g} (the phantom's removal is -inf), got {text!r}"
        )
    return value


def layer_neuron(text: str) -> tuple[int, int]:
    """An argparse type: a register neuron as ``layer:neuron`` (two integers from 0), else one line."""
    layer, _, neuron = text.partition(":")
    if not (layer.isdigit() and neuron.isdigit()):
        raise argparse.ArgumentTypeError(f"expected layer:neuron, two integers from 0 (e.g. 3:1187), got {text!r}")
    return int(layer), int(neuron)


def add_parser(sub) -> argparse.ArgumentParser:
    p = analysis_parser(sub, "ablate", HELP, DEFAULT_MODEL, DESCRIPTION)
    g = p.add_argument_group("interventions")
    g.add_argument(
        "--ablate",
        nargs="+",
        choices=INTERVENTIONS,
        default=None,
        metavar="NAME",
        help=f"interventions: {', '.join(INTERVENTIONS)} (default {' '.join(DEFAULT_INTERVENTIONS)}, those of them "
        "the model takes, a note naming any skipped; the flags below add their own)",
    )
    g.add_argument(
        "--value",
        nargs="+",
        choices=VALUE_MODES,
        default=None,
        metavar="MODE",
        help="position 0's value read set to zero, the mean of positions 1..T-1, or the read at position "
        "1 (swap); default zero mean",
    )
    g.add_argument(
        "--sink-logit",
        nargs="+",
        type=sink_logit,
        default=None,
        metavar="C",
        help="phantom logit(s) fixed to C (besides the phantom's removal); adds phantom",
    )
    g.add_argument(
        "--gate",
        nargs="+",
        choices=GATE_MODES,
        default=None,
        metavar="MODE",
        help="scalar value gates held open, closed or at their clean mean (default all three); adds gate",
    )
    _eviction_flags(g)
    g.add_argument(
        "--depth",
        nargs="+",
        choices=DEPTH_MODES,
        default=None,
        metavar="MODE",
        help="depth reads forced to the uniform mix, the residual sum, or with one source category "
        "dropped; hyper-connections' weights forced to uniform or no stream mixing (default all three); adds depth",
    )
    _register_flags(g)
    g.add_argument(
        "--per-head", action="store_true", help="also one head at a time (KV heads; query heads for phantom edits)"
    )
    g.add_argument("--no-per-layer", action="store_true", help="only every layer (site) at once, not one at a time")
    output_flags(p)
    return p


def _eviction_flags(g) -> None:
    """Window eviction's settings (each adds evict)."""
    g.add_argument(
        "--keep",
        nargs="+",
        type=nonneg_int,
        default=None,
        metavar="K",
        help="window eviction: the first K keys kept (default 0 1 4); adds evict",
    )
    g.add_argument(
        "--window",
        nargs="+",
        type=positive_int,
        default=None,
        metavar="W",
        help="window eviction: query t sees t-W+1..t besides the kept keys (default 64); adds evict",
    )
    g.add_argument(
        "--positions",
        nargs="+",
        choices=POSITIONS,
        default=None,
        metavar="WHERE",
        help="window eviction: keys at their positions in the text (original) or within the cache as StreamingLLM "
        "assigns them (cache: rotary models); default original; adds evict",
    )


def _register_flags(g) -> None:
    """The test-time register's settings (each adds register)."""
    g.add_argument(
        "--register-at",
        nargs="+",
        choices=REGISTER_PLACES,
        default=None,
        metavar="WHERE",
        help="test-time register (Jiang et al. 2025) before the text (start: every query sees it) or after it (end: "
        "the authors' place, seen by no text query of a causal LM); default start; adds register",
    )
    g.add_argument(
        "--register-neurons",
        nargs="+",
        type=layer_neuron,
        default=None,
        metavar="L:N",
        help="the register neurons moved onto the register, as layer:neuron (default: the 10 top ones of "
        "`probe sinks --register-neurons` over the same windows); adds register",
    )


# each flag and the field of probe.analyses.ablate.AblationOptions it sets (a flag not given: the field's default)
OPTION_FLAGS = (
    ("value", "value_modes"),
    ("sink_logit", "sink_logits"),
    ("gate", "gate_modes"),
    ("keep", "keep"),
    ("window", "windows"),
    ("positions", "positions"),
    ("depth", "depth_modes"),
    ("register_at", "register_at"),
    ("register_neurons", "register_neurons"),
)


def settings(args: argparse.Namespace) -> dict:
    """The AblationOptions fields the flags set: each given flag as a tuple (``--positions cache`` is
    ``positions=("cache",)``), and the scopes."""
    given = {field: tuple(getattr(args, flag)) for flag, field in OPTION_FLAGS if getattr(args, flag) is not None}
    return {**given, "per_layer": not args.no_per_layer, "per_head": args.per_head}


def interventions(args: argparse.Namespace) -> list[str]:
    """The interventions asked for: --ablate, plus each one whose own flag was given."""
    chosen = list(args.ablate or ([] if _implied(args) else DEFAULT_INTERVENTIONS))
    return list(dict.fromkeys(chosen + _implied(args)))


def _implied(args) -> list[str]:
    flags = [
        ("value", args.value),
        ("phantom", args.sink_logit),
        ("gate", args.gate),
        ("evict", args.keep),
        ("evict", args.window),
        ("evict", args.positions),
        ("depth", args.depth),
        ("register", args.register_at),
        ("register", args.register_neurons),
    ]
    return list(dict.fromkeys(name for name, value in flags if value is not None))


def run(args: argparse.Namespace) -> int:
    from probe.analyses.ablate import AblationError, ablate
    from probe.cli.prepare import start
    from probe.errors import UsageError
    from probe.present import ablate as presentation
    from probe.present.files import publish

    run = start(args, DEFAULT_MODEL, "ablate")
    try:
        chosen = interventions(args)
        if not args.ablate and not _implied(args):  # nothing asked for: the defaults this model takes
            chosen = _taken_defaults(run, chosen, settings(args))
        result = ablate(run.model, run.windows, chosen, progress=run.progress, **settings(args))
    except AblationError as e:
        raise UsageError(str(e)) from None
    publish(run.output, "ablate", result, presentation, run.console)
    return 0


def _taken_defaults(run, defaults: list[str], options: dict) -> list[str]:
    """The default interventions the model takes, each one it refuses named in a note (a softpick, stick-breaking or
    DIFF model takes no key-0 knockout); AblationError, the first refusal's line, when it takes none of them."""
    from probe.analyses.ablate import AblationError, find_mechanisms, plan
    from probe.analyses.capture import as_windows, model_device

    mech = find_mechanisms(run.model, as_windows(run.windows).inputs(0, model_device(run.model)))
    taken, refusals = [], []
    for name in defaults:
        try:
            plan(run.model, mech, [name], **options)
            taken.append(name)
        except AblationError as e:
            refusals.append(e)
            run.console.note(f"default {name} skipped: {e}")
    if not taken:
        raise refusals[0]
    return taken
