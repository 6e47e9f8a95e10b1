"""The flags several verbs share, declared once, and the one place that reads them off an ``argparse.Namespace``
as typed specs.

Groups: the model and its evaluation windows (``model_flags``, with the big-checkpoint placement flags of
``placement_flags``), the outputs (``output_flags``), the Sink^eps thresholds (``eps_flag``), injection
(``injection_flags``) and a non-finite model reported without a verdict (``nonfinite_flag``). The argparse types
that turn a bad number into one line are ``probe.options``'s; a verb's own flags live in its module
(``probe.cli.<verb>``).

Only argparse and light modules are imported here (no torch, pandas or plotly), so ``probe --help`` stays under a
second. Lists are deduplicated by the readers, in the order given (``--dose 0.4 0.4`` is one condition, ``--eps 0.3
0.3`` one threshold).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from probe.catalogue import CUTOFFS, JUNK_TYPES, PROTOCOLS, WINDOW_MODES
from probe.jobs.specs import DEVICE_MAPS, InjectionSpec, ModelSpec, WindowSpec, parse_device_map, parse_max_memory
from probe.options import attention_share, dose, nonneg_int, positive_int, threads
from probe.present.files import OutputSpec

# The embedded default models: zoo checkpoints when installed, else a freshly initialised tiny model of the
# same variant built in-process (seed 0). Switching to another zoo name is a one-line change here.
DEFAULT_MODEL = "probe/tiny-sink+proj"
DEFAULT_DEPTH_MODEL = "probe/tiny-attnres-block4"  # `probe sources` needs depth routing
# `probe inject` (the main job) needs a sink to show its phenomenon: the zoo's Bigram-Backcopy baseline, trained as
# the sink-emergence recipe trains it, has one (4.1x the causal-uniform share, r0 0.39) and runs on its own chain;
# the tiny text models, 600 steps on 1.2M tokens, have not formed one (docs/getting-started.md)
DEFAULT_SINK_MODEL = "probe/bb-baseline"
DTYPES = ("auto", "float32", "bfloat16", "float16")


def _user_value(parse):
    """An argparse type from a parser of probe.jobs.specs whose ValueError is the one-line message (argparse names the
    flag itself)."""

    def typ(text: str):
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e).split(": ", 1)[-1]) from None

    typ.__name__ = parse.__name__
    return typ


device_map = _user_value(parse_device_map)
max_memory = _user_value(parse_max_memory)


OUT_HELP = (
    "write CSV, JSON and an HTML page of plotly figures to DIR (the page loads the plotly.min.js written beside it: "
    "move the folder as a whole, or pass --self-contained for a page that works alone)"
)


def output_flags(p, out_help=OUT_HELP, *, reads_data: bool = True):
    """--out, --json, --quiet, then ``folder_flags``; ``reads_data``: the verb reads --data (``model_flags``)."""
    p.add_argument("--out", metavar="DIR", help=out_help)
    p.add_argument("--json", action="store_true", help="print machine-readable results (JSON) on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress bars or notes on stderr")
    folder_flags(p, reads_data=reads_data)


def mechanism_flags(p) -> None:
    """--entropy, --kurtosis and --norm-weighted: the sink-mechanism companions of the sink pass (probe sinks, probe
    report; probe.analyses.sink_pass)."""
    p.add_argument("--entropy", action="store_true", help="also report attention entropy per head (Zhai et al. 2023)")
    p.add_argument(
        "--kurtosis",
        action="store_true",
        help="also report the kurtosis of neuron RMS per layer, outlier features (He et al. 2024)",
    )
    p.add_argument(
        "--norm-weighted",
        action="store_true",
        help="also report key 0's share of each head's norm-weighted attention ||a f(x)|| (Kobayashi et al. 2020)",
    )


def folder_flags(p, *, reads_data: bool):
    """The flags every verb that writes an --out folder ends with: how its pages load plotly.js, whether to wait for
    the folder's lock (probe.jobs.lock, held while the verb runs) and, when it reads --data, how bad records are met
    (probe.data.corpus)."""
    p.add_argument(
        "--self-contained",
        action="store_true",
        help="HTML pages carry plotly.js inline (one 4.8 MB file "
        "each) instead of loading the plotly.min.js written beside them",
    )
    p.add_argument(
        "--wait",
        action="store_true",
        help="when another probe process holds --out, wait for it "
        "to finish instead of stopping (exit 2) with a line naming it",
    )
    if reads_data:
        p.add_argument(
            "--skip-bad-records",
            action="store_true",
            help='skip .jsonl records without a string "text" (a warning counts them) instead of stopping at the first',
        )


def analysis_parser(
    sub, verb: str, help: str, default_model: str | None, description: str | None = None, several_ctx: bool = False
):
    """An analysis verb's parser with its model and window flags (the verb adds its own, then ``output_flags``);
    ``several_ctx``: --ctx takes one or more lengths (a list in args.ctx)."""
    p = sub.add_parser(verb, help=help, description=description or help, allow_abbrev=False)
    model_flags(p, default_model, several_ctx=several_ctx)
    return p


def model_flags(p, default_model: str | None, *, defaults=(8, 8), several_ctx: bool = False):
    g = p.add_argument_group("model and evaluation windows")
    if default_model is not None:
        g.add_argument(
            "--model",
            metavar="NAME",
            help="zoo name, pythia-410m[@stepN], gpt-oss-20b, HF repo id, local "
            f"directory or .gguf file (default: the bundled model {default_model})",
        )
    g.add_argument(
        "--data",
        metavar="CORPUS",
        default=None,
        help="bundled corpus (wikitext-2-test, wikitext-2-valid, shakespeare, kjv, train), a .txt or "
        ".jsonl[.gz] file, a directory, hf:... (online), or synthetic:bb[vocab=..,triggers=..,seed=..,T=..] "
        "(Bigram-Backcopy; bare synthetic:bb = the chain the model trained on), "
        "synthetic:random[T=..,n=..,seed=..] or "
        "synthetic:repeat[T=..,n=..,token=..] (token ids for any model); default: a "
        "Bigram-Backcopy model's own chain, else wikitext-2-test",
    )
    g.add_argument(
        "--tokenizer", metavar="NAME", help="tokenizer (default: the model's own, else the shipped probe-bpe-8k)"
    )
    g.add_argument(
        "--batches", type=positive_int, default=defaults[0], help=f"evaluation batches (default {defaults[0]})"
    )
    g.add_argument(
        "--batch-size", type=positive_int, default=defaults[1], help=f"windows per batch (default {defaults[1]})"
    )
    several = dict(nargs="+", metavar="T") if several_ctx else {}
    g.add_argument(
        "--ctx",
        type=positive_int,
        **several,
        help="tokens per window (default: a custom model's training context; HF checkpoints min(1024, "
        "maximum))" + ("; several lengths run the analysis at each and report it against T" if several_ctx else ""),
    )
    g.add_argument(
        "--window-mode",
        choices=WINDOW_MODES,
        default="auto",
        help="how windows are drawn: first window "
        "of each document, sequential windows, random, or packed (documents joined by EOS, cut into "
        "consecutive windows, as pretraining packs them); auto = first, else sequential, else packed when no early "
        "document holds a window (default auto)",
    )
    g.add_argument("--seed", type=nonneg_int, default=0, help="seed of the window choice and of injected noise")
    g.add_argument(
        "--bos",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="start each window with the tokenizer's BOS (then BOS + ctx-1 text tokens); default: exactly "
        "when the tokenizer prepends one to plain text (Gemma) or the model trained with one",
    )
    g.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, ... (default: cuda if available, else cpu)")
    g.add_argument("--dtype", choices=DTYPES, default="auto", help="weights dtype (default: float32 on CPU)")
    g.add_argument("--threads", type=threads, help="CPU threads for torch (default: torch's choice)")
    placement_flags(g)


def placement_flags(g):
    """Big checkpoints: accelerate's device map over GPUs, CPU and disk."""
    g.add_argument(
        "--device-map",
        type=device_map,
        metavar="MAP",
        help="spread the model over devices with "
        f"accelerate: {', '.join(DEVICE_MAPS)}, or a JSON object {{module: device}} (default: all on "
        "--device; implied auto by --max-memory)",
    )
    g.add_argument(
        "--max-memory",
        type=max_memory,
        metavar="BUDGET",
        help="per-device budget of the device map: "
        "cpu=200MB,0=10GiB,disk=... or the same as JSON; what does not fit goes to the next device, "
        "disk last",
    )
    g.add_argument(
        "--offload-dir",
        metavar="DIR",
        help="folder for weights offloaded to disk (default: a temporary folder removed at exit)",
    )


def eps_flag(p):
    p.add_argument(
        "--eps",
        nargs="+",
        type=attention_share,
        default=[0.3],
        metavar="EPS",
        help="Sink^eps thresholds: a head is a sink head when its mean attention on key 0 exceeds eps "
        "(Gu et al. 2025; default 0.3)",
    )


def protocol_flag(p):
    p.add_argument(
        "--protocol",
        choices=PROTOCOLS,
        default="pooled",
        help="Sink^eps protocol: pooled (probe's: rows t >= 1 of every window pooled per head, thresholded "
        "once) or gu2025 (Gu et al.'s released evaluation: the first 64 tokens of each text with the "
        "tokenizer's special tokens, query 0 included, thresholded per text; fixes --ctx, "
        "--window-mode and --bos); default pooled",
    )


def nonfinite_flag(p):
    """--allow-nonfinite: a model whose captured tensors hold NaN or infinities is reported, marked, with no verdict
    (default: one line naming the tensor, exit 2; docs/definitions.md#sink-rule)."""
    p.add_argument(
        "--allow-nonfinite",
        action="store_true",
        help="when the model's attention, hidden states or logits hold NaN or infinite values, report the numbers "
        "(computed over every entry, so NaN propagates), marked, without a verdict, instead of stopping (exit 2) "
        "with a line naming the tensor",
    )


def injection_flags(p, dose_flag: str, dose_default, dose_help: str):
    g = p.add_argument_group("injection")
    g.add_argument(
        "--junk",
        nargs="+",
        choices=JUNK_TYPES + ("all",),
        default=["structured"],
        metavar="KIND",
        help=f"junk direction(s): {', '.join(JUNK_TYPES)}, or all (default structured)",
    )
    g.add_argument(dose_flag, dest="dose", nargs="+", type=dose, default=dose_default, metavar="EPS", help=dose_help)
    g.add_argument(
        "--cutoff",
        nargs="+",
        choices=tuple(CUTOFFS),
        default=["q25"],
        metavar="Q",
        help="quiet reads: the q25 (default) or median smallest read norms",
    )


# ------------------------------------------------------------------------------------------------- reading


def _unique(values) -> tuple:
    return tuple(dict.fromkeys(values))


def check_model_flags(args: argparse.Namespace) -> None:
    """A model name that cannot load is one line before torch is imported (probe.jobs.model_names): ``--model`` in
    full, a report's ``--models`` by the names alone (a shard or a resumed report loads only some of them)."""
    model, models = getattr(args, "model", None), getattr(args, "models", None)
    if not isinstance(model, str) and not models:
        return
    from probe.jobs.model_names import check_model_name

    if isinstance(model, str):
        check_model_name(model, "--model")
    for name in models or ():
        check_model_name(name, "--models/--checkpoints", hub=False)


def model_spec(args: argparse.Namespace, default: str | None = None) -> ModelSpec:
    """--model (``default`` when absent), --device, --dtype, --threads, --device-map, --max-memory, --offload-dir."""
    return ModelSpec(
        name=args.model,
        default=default,
        device=args.device,
        dtype=args.dtype,
        threads=args.threads,
        device_map=args.device_map,
        max_memory=args.max_memory,
        offload_dir=args.offload_dir,
    )


def window_spec(args: argparse.Namespace) -> WindowSpec:
    """--data, --tokenizer, --batches, --batch-size, --ctx, --window-mode, --seed, --bos / --no-bos (and --protocol,
    on the verbs that have it)."""
    return WindowSpec.of(args, tokenizer=args.tokenizer, protocol=getattr(args, "protocol", "pooled"))


def injection_spec(args: argparse.Namespace) -> InjectionSpec | None:
    """--junk, --cutoff and the doses (--dose, or report's --inject-doses); None when no dose was asked for."""
    if not args.dose:
        return None
    return InjectionSpec(doses=_unique(args.dose), junk=_unique(args.junk), cutoffs=_unique(args.cutoff))


def _is_main() -> bool:
    """Rank 0 of the process group, or the only process. A group exists only once torch.distributed is imported
    (probe.cli.distributed does so before the verb runs), so a verb that never imports torch, like ``probe models``,
    is the main process without importing it (torch costs seconds)."""
    if "torch.distributed" not in sys.modules:
        return True
    from probe.process_group import is_main

    return is_main()


def output_spec(args: argparse.Namespace) -> OutputSpec:
    """--out, --json, --quiet, --self-contained; under torchrun only rank 0 writes and prints (the others are quiet)."""
    if not _is_main():
        return OutputSpec(out=None, as_json=False, quiet=True, writer=False)
    return OutputSpec(
        out=Path(args.out) if args.out else None,
        as_json=args.json,
        quiet=args.quiet,
        self_contained=getattr(args, "self_contained", False),
    )


def eps_values(args: argparse.Namespace) -> tuple[float, ...]:
    """--eps: the Sink^eps thresholds."""
    return _unique(args.eps)
