"""The ``probe`` command line: every verb's flags, with one-line errors (``probe VERB: error: ...``, exit code 2).

Only argparse and ``probe.present.errors`` are imported here, so ``probe --help`` and ``probe VERB --help`` stay under a
second; the verbs' modules (``probe.cli.analyses``, ``catalogue``, ``train``, ``report``) import torch and run them.
"""
from __future__ import annotations

import argparse
import difflib
import math

from probe import __version__
from probe.present.errors import UsageError, UsageParser
from probe.jobs.specs import DEVICE_MAPS, parse_device_map, parse_max_memory

# The embedded default models: zoo checkpoints when installed, else a freshly initialised tiny model of the
# same variant built in-process (seed 0). Switching to another zoo name is a one-line change here.
DEFAULT_MODEL = "probe/tiny-sink+proj"
DEFAULT_DEPTH_MODEL = "probe/tiny-attnres-block4"  # `probe sources` needs depth routing
# mirrored from probe.analyses.inject (kept light here; tests/test_cli.py checks they agree)
JUNK_TYPES = ("structured", "same-context", "gaussian", "random-direction", "own-direction")
CUTOFFS = ("q25", "median")
DEFAULT_DOSES = (0.2, 0.4, 0.8, 1.6)
DTYPES = ("auto", "float32", "bfloat16", "float16")
WINDOW_MODES = ("auto", "first", "sequential", "random")


def _number(cast, valid, message):
    """An argparse type: ``cast(text)`` that must satisfy ``valid``, else one line ``message, got 'text'``."""
    def parse(text: str):
        try:
            value = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{message}, got {text!r}") from None
        if not valid(value):
            raise argparse.ArgumentTypeError(f"{message}, got {text!r}")
        return value
    return parse


positive_int = _number(int, lambda v: v >= 1, "expected a positive integer")
nonneg_int = _number(int, lambda v: v >= 0, "expected an integer >= 0")
dose = _number(float, lambda v: math.isfinite(v) and v >= 0, "dose must be a finite number >= 0")
positive_float = _number(float, lambda v: math.isfinite(v) and v > 0, "expected a positive number")
nonneg_float = _number(float, lambda v: math.isfinite(v) and v >= 0, "expected a finite number >= 0")
fraction = _number(float, lambda v: 0 <= v <= 1, "expected a number in [0, 1]")
attention_share = _number(float, lambda v: 0 <= v < 1, "expected a share of attention mass, 0 <= eps < 1")


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


def _output_flags(p, out_help="write CSV, JSON and a plotly HTML figure to DIR"):
    p.add_argument("--out", metavar="DIR", help=out_help)
    p.add_argument("--json", action="store_true", help="print machine-readable results (JSON) on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress bars or notes on stderr")
    _self_contained_flag(p)


def _self_contained_flag(p):
    p.add_argument("--self-contained", action="store_true", help="HTML pages carry plotly.js inline (one 4.8 MB file "
                   "each) instead of loading the plotly.min.js written beside them")


def _model_flags(p, default_model: str | None, *, defaults=(8, 8)):
    g = p.add_argument_group("model and evaluation windows")
    if default_model is not None:
        g.add_argument("--model", metavar="NAME", help="zoo name, pythia-410m[@stepN], gpt-oss-20b, HF repo id, local "
                       f"directory or .gguf file (default: the bundled model {default_model})")
    g.add_argument("--data", metavar="CORPUS", default=None,
                   help="bundled corpus (wikitext-2-test, wikitext-2-valid, shakespeare, kjv, train), a .txt or "
                   ".jsonl[.gz] file, a directory, hf:... (online), or synthetic:bb[vocab=..,triggers=..,seed=..,T=..] "
                   "(Bigram-Backcopy; bare synthetic:bb = the chain the model trained on); default: a "
                   "Bigram-Backcopy model's own chain, else wikitext-2-test")
    g.add_argument("--tokenizer", metavar="NAME", help="tokenizer (default: the model's own, else the shipped "
                   "probe-bpe-8k)")
    g.add_argument("--batches", type=positive_int, default=defaults[0], help=f"evaluation batches (default "
                   f"{defaults[0]})")
    g.add_argument("--batch-size", type=positive_int, default=defaults[1], help=f"windows per batch (default "
                   f"{defaults[1]})")
    g.add_argument("--ctx", type=positive_int, help="tokens per window (default: a custom model's training context; "
                   "HF checkpoints min(1024, maximum))")
    g.add_argument("--window-mode", choices=WINDOW_MODES, default="auto", help="how windows are drawn: first window "
                   "of each document, sequential windows, or random; auto = first, else sequential (default auto)")
    g.add_argument("--seed", type=nonneg_int, default=0, help="seed of the window choice and of injected noise")
    g.add_argument("--bos", action=argparse.BooleanOptionalAction, default=None,
                   help="start each window with the tokenizer's BOS (then BOS + ctx-1 text tokens); default: exactly "
                   "when the tokenizer prepends one to plain text (Gemma) or the model trained with one")
    g.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, ... (default: cuda if available, else cpu)")
    g.add_argument("--dtype", choices=DTYPES, default="auto", help="weights dtype (default: float32 on CPU)")
    g.add_argument("--threads", type=positive_int, help="CPU threads for torch (default: torch's choice)")
    _placement_flags(g)


def _placement_flags(g):
    """Big checkpoints: accelerate's device map over GPUs, CPU and disk."""
    g.add_argument("--device-map", type=device_map, metavar="MAP", help="spread the model over devices with "
                   f"accelerate: {', '.join(DEVICE_MAPS)}, or a JSON object {{module: device}} (default: all on "
                   "--device; implied auto by --max-memory)")
    g.add_argument("--max-memory", type=max_memory, metavar="BUDGET", help="per-device budget of the device map: "
                   "cpu=200MB,0=10GiB,disk=... or the same as JSON; what does not fit goes to the next device, "
                   "disk last")
    g.add_argument("--offload-dir", metavar="DIR", help="folder for weights offloaded to disk (default: a temporary "
                   "folder removed at exit)")


def _eps_flag(p):
    p.add_argument("--eps", nargs="+", type=attention_share, default=[0.3], metavar="EPS",
                   help="Sink^eps thresholds: a head is a sink head when its mean attention on key 0 exceeds eps "
                        "(Gu et al. 2025; default 0.3)")


def _injection_flags(p, dose_flag: str, dose_default, dose_help: str):
    g = p.add_argument_group("injection")
    g.add_argument("--junk", nargs="+", choices=JUNK_TYPES + ("all",), default=["structured"], metavar="KIND",
                   help=f"junk direction(s): {', '.join(JUNK_TYPES)}, or all (default structured)")
    g.add_argument(dose_flag, dest="dose", nargs="+", type=dose, default=dose_default, metavar="EPS", help=dose_help)
    g.add_argument("--cutoff", nargs="+", choices=CUTOFFS, default=["q25"], metavar="Q",
                   help="quiet reads: the q25 (default) or median smallest read norms")


def build_parser() -> UsageParser:
    parser = UsageParser(prog="probe", description="Mechanistic interpretability of attention routing: sinks, phantom "
                    "keys, value gates, depth routing.", allow_abbrev=False,
                    epilog="`probe VERB --help` lists a verb's flags. Errors exit with code 2.")
    parser.add_argument("--version", action="version", version=f"probe {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=UsageParser)

    def verb(name, help_, description=None):
        return sub.add_parser(name, help=help_, description=description or help_, allow_abbrev=False)

    p = verb("models", "list variants, tiers, zoo checkpoints and known checkpoint names")
    _output_flags(p, "write models.csv and models.json to DIR")

    p = verb("inject", "value-noise injection: loss increase when quiet value reads receive junk",
             "Inject junk into the quiet value reads of every layer at once and report the loss increase per "
             "condition (junk x cutoff x dose), plus the attention exposure to quiet reads and to the phantom.")
    _model_flags(p, DEFAULT_MODEL)
    _injection_flags(p, "--dose", list(DEFAULT_DOSES), "dose(s) eps, finite and >= 0 (default 0.2 0.4 0.8 1.6)")
    p.add_argument("--no-exposure", action="store_true", help="skip the exposure statistics")
    _output_flags(p)

    p = verb("sinks", "attention-sink statistics: position-0 share, phantom share, r0, Sink^eps")
    _model_flags(p, DEFAULT_MODEL)
    _eps_flag(p)
    p.add_argument("--massive", action="store_true", help="also report massive activations (Sun et al. 2024)")
    p.add_argument("--dormant", action="store_true", help="also report active/dormant heads per input domain "
                   "(Guo et al. 2024)")
    p.add_argument("--dormant-corpora", nargs="+", default=["wikitext-2-test", "shakespeare", "kjv"],
                   metavar="CORPUS", help="input domains for --dormant (default: the three bundled corpora)")
    _output_flags(p)

    p = verb("sources", "effective depth sources and mean depth heatmap of a depth-routed model")
    _model_flags(p, DEFAULT_DEPTH_MODEL)
    _output_flags(p)

    p = verb("gates", "value-gate statistics: mean gate, selectivity, per-token gates")
    _model_flags(p, DEFAULT_MODEL)
    p.add_argument("--min-count", type=positive_int, default=50, help="minimum occurrences for the token table "
                   "(default 50)")
    _output_flags(p)

    p = verb("costs", "FLOP and parameter cost model of AttnRes / P-LR / S-LR (LR-AttnRes 2026 Table 1)",
             "Added FLOPs and parameters of depth routing. Default dimensions are LR-AttnRes 2026 Table 1's "
             "(d=1024, L=24, m=2816); --tier takes them from a model tier.")
    p.add_argument("--tier", help="take d, L and m from a model tier (see `probe models`)")
    p.add_argument("--d", type=positive_int, help="model width d (default 1024)")
    p.add_argument("--layers", type=positive_int, help="layers L (default 24)")
    p.add_argument("--mlp", type=positive_int, help="MLP width m (default 2816)")
    _output_flags(p)

    p = verb("report", "batch sink report over many models or training checkpoints (resumable)",
             "Sink statistics (and optionally injection) for every model or checkpoint, written as CSV and one "
             "self-contained offline HTML report. Killed and started again with the same arguments, it continues "
             "where it stopped.")
    g = p.add_argument_group("what to compare")
    g.add_argument("--models", nargs="+", metavar="NAME", help="model names or directories")
    g.add_argument("--checkpoints", metavar="SPEC", help="checkpoints of one model: pythia-160m@step1000,step2000,...")
    g.add_argument("--shard", metavar="I/N", help="compute only shard I of N (1-based; every N-th model from the I-th): "
                   "one job of a job array, e.g. --shard $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT; resumable")
    g.add_argument("--merge", nargs="+", metavar="DIR", help="join the folders of all N shards of one run into --out "
                   "(computes nothing; CSV rows as an unsharded run's)")
    _model_flags(p, None)
    p.set_defaults(model=None)  # each of --models / --checkpoints in turn, never one --model
    _eps_flag(p)
    _injection_flags(p, "--inject-doses", None, "also run injection at these doses (default: no injection)")
    p.add_argument("--out", metavar="DIR", default="probe-report", help="report directory (default probe-report)")
    p.add_argument("--json", action="store_true", help="print the summary table as JSON on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress bars or notes on stderr")
    _self_contained_flag(p)

    p = verb("experiment", "run one of the papers' experiment recipes: probe experiment NAME --out DIR "
             "(probe experiment --list; NAME --help lists its options)")
    p.add_argument("recipe", nargs=argparse.REMAINDER, help="NAME --out DIR [options]")

    p = verb("train", "train a custom model; the same command resumes an interrupted run",
             "Train a custom variant; writes metrics.jsonl, checkpoint/ and, when finished, model/ (weights and "
             "tokenizer, loadable with --model DIR) to --out.")
    p.add_argument("--variant", default="baseline", help="model variant (see `probe models`; default baseline)")
    p.add_argument("--tier", default="tiny", help="size tier (default tiny)")
    p.add_argument("--seed", type=nonneg_int, default=0, help="seed of the weights, data order and loop")
    p.add_argument("--data", default="train", help="training corpus (default: the bundled training mix), or "
                   "synthetic:bb[vocab=..,triggers=..,seed=..] for an endless Bigram-Backcopy stream (--ctx is its T)")
    p.add_argument("--tokenizer", default="probe-bpe-8k", help="tokenizer (default probe-bpe-8k)")
    p.add_argument("--bos", action="store_true", help="every training window starts with BOS (the tokenizer's, else "
                   "its EOS); recorded in the run, so analyses of the model start their windows with it too")
    p.add_argument("--steps", type=positive_int, default=1000, help="optimizer steps (default 1000)")
    p.add_argument("--batch-size", type=positive_int, default=64, help="windows per step (default 64)")
    p.add_argument("--ctx", type=positive_int, help="tokens per window (default: the tier's context)")
    p.add_argument("--lr", type=positive_float, default=6e-4, help="peak learning rate (default 6e-4)")
    p.add_argument("--warmup", type=nonneg_int, default=100, help="warmup steps (default 100)")
    p.add_argument("--schedule", choices=("cosine", "linear-warmdown"), default="cosine",
                   help="after warmup: cosine to --min-lr-ratio, or constant then a linear warmdown (default cosine)")
    p.add_argument("--min-lr-ratio", type=fraction, default=0.1, help="final lr / peak lr (default 0.1)")
    p.add_argument("--optimizer", choices=("adamw", "muon"), default="adamw",
                   help="AdamW, or Muon for hidden matrices with Adam for the rest (default adamw)")
    p.add_argument("--muon-lr", type=positive_float, default=1e-3, help="Muon's peak lr with --optimizer muon "
                   "(default 1e-3)")
    p.add_argument("--weight-decay", type=nonneg_float, default=0.1,
                   help="on >=2-D weights not excluded by role: sinks, gates, queries, mixing weights (default 0.1)")
    p.add_argument("--grad-clip", type=nonneg_float, default=1.0, help="global norm clip, 0: none (default 1.0)")
    p.add_argument("--z-loss", type=nonneg_float, default=0.0, help="weight of mean(logsumexp^2) (default 0)")
    p.add_argument("--grad-accum", type=positive_int, default=1,
                   help="micro-steps per optimizer step; --batch-size stays the whole step's windows (default 1)")
    p.add_argument("--eval-every", type=nonneg_int, default=250, help="steps between evaluations (0: at the end)")
    p.add_argument("--ckpt-every", type=nonneg_int, default=500, help="steps between checkpoints (0: at the end)")
    p.add_argument("--snapshot-every", type=nonneg_int, default=0,
                   help="keep the model at step 0, every N steps and at the end in DIR/snapshots/ for "
                        "`probe report --checkpoints DIR` (default 0: none)")
    p.add_argument("--eval-data", default="heldout", help="validation corpus: heldout = 5%% of --data's documents "
                   "(smallest SHA-256), never sampled for training; or any --data name, e.g. wikitext-2-test "
                   "(default heldout)")
    p.add_argument("--eval-batches", type=positive_int, default=8, help="held-out batches of 8 windows (default 8)")
    p.add_argument("--device", default="auto", help="cpu, cuda, ... (default: cuda if available)")
    p.add_argument("--threads", type=positive_int, help="CPU threads for torch (default: torch's choice)")
    p.add_argument("--out", metavar="DIR", required=True, help="run directory (required)")
    p.add_argument("--json", action="store_true", help="print the final metrics as JSON on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress bars or notes on stderr")
    _self_contained_flag(p)

    p = verb("view", "one page of viewers for one text: attention pattern (any layer and head, phantom column), "
             "depth weights, gates over the text",
             "Capture one text's attention patterns (every layer and head, the phantom as the first column), depth-"
             "attention weights (depth-routed models) and value gates (gated models) and write DIR/view.html: one "
             "offline page with layer and head pickers.")
    g = p.add_argument_group("model and text")
    g.add_argument("--model", metavar="NAME", help=f"any --model form of the other verbs (default: the bundled model "
                   f"{DEFAULT_MODEL})")
    src = g.add_mutually_exclusive_group()
    src.add_argument("--text", metavar="TEXT", help="the text to view (tokenized without special tokens)")
    src.add_argument("--data", metavar="CORPUS", help="view a document of this corpus instead (any --data form; "
                     "default wikitext-2-test)")
    g.add_argument("--doc", type=nonneg_int, default=0, help="which document of --data (default 0, the first)")
    g.add_argument("--max-tokens", type=positive_int, default=128, help="cut the text to its first N tokens (at most "
                   "the model's context; default 128: every token label stays readable)")
    g.add_argument("--tokenizer", metavar="NAME", help="tokenizer (default: the model's own)")
    g.add_argument("--device", default="auto", help="cpu, cuda, ... (default: cuda if available, else cpu)")
    g.add_argument("--dtype", choices=DTYPES, default="auto", help="weights dtype (default: float32 on CPU)")
    g.add_argument("--threads", type=positive_int, help="CPU threads for torch (default: torch's choice)")
    _placement_flags(g)
    p.add_argument("--out", metavar="DIR", required=True, help="folder for view.html (required)")
    p.add_argument("--quiet", action="store_true", help="no progress bars or notes on stderr")
    _self_contained_flag(p)

    p = verb("eval", "next-token loss and perplexity on evaluation windows")
    _model_flags(p, DEFAULT_MODEL)
    _output_flags(p)
    from probe.cli.doctor import add_doctor_parser  # torch-free module: `probe --help` stays fast
    add_doctor_parser(sub)
    return parser


def check_unknown(parser: UsageParser, args, extra: list[str]) -> None:
    """Unknown flags: one line naming them and the verb's valid flags (with a close match when there is one)."""
    if not extra:
        return
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    p = sub.choices.get(args.verb, parser)
    valid = sorted({o for a in p._actions for o in a.option_strings if o.startswith("--")})
    bad = extra[0]
    close = difflib.get_close_matches(bad.split("=")[0], valid, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    what = "option" if bad.startswith("-") else "argument"
    raise UsageError(f"unknown {what} {bad!r}{hint}; valid options: {', '.join(valid)}", prog=p.prog)
