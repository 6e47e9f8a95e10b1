"""``probe train``: train a custom variant into a run directory (layout: ``probe.runs``); the same command resumes.

The run's identity (the flags that determine the weights) is recorded in ``RUN/probe_train.json``; an existing run
directory with another identity, or a directory that is not a run, is a one-line error before anything is written.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING

from probe.cli.flags import folder_flags
from probe.console import note as stderr_note
from probe.errors import UsageError, first_line
from probe.options import add_options, positive_int, threads
from probe.runs import FINAL_MODEL, MODEL_CONFIG, RUN_IDENTITY
from probe.train.config import TrainConfig

if TYPE_CHECKING:
    from probe.data.synthetic import BigramBackcopy

# TrainConfig's fields that are flags (their help, type and default declared on the field, probe.options.option) ...
CONFIG_FLAGS = tuple(f.name for f in dataclasses.fields(TrainConfig) if "option" in f.metadata)
# ... in the groups --help shows them in, among probe train's own flags (together exactly CONFIG_FLAGS)
SEED_FLAGS = ("seed",)
SIZE_FLAGS = ("steps", "batch_size")
LOOP_FLAGS = (
    "lr",
    "warmup",
    "schedule",
    "min_lr_ratio",
    "optimizer",
    "muon_lr",
    "weight_decay",
    "grad_clip",
    "z_loss",
    "grad_accum",
    "eval_every",
    "ckpt_every",
    "snapshot_every",
)
DEVICE_FLAGS = ("device", "flush_denormal")
VERB = "train"  # this module is `probe train` (probe.cli.main finds verbs by this line)
RANK = 100  # its place in `probe --help`
HELP = "train a custom model; the same command resumes an interrupted run"
DESCRIPTION = (
    "Train a custom variant; writes metrics.jsonl, checkpoint/ and, when finished, model/ (weights and "
    "tokenizer, loadable with --model DIR) to --out."
)


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("train", help=HELP, description=DESCRIPTION, allow_abbrev=False)
    p.add_argument("--variant", default="baseline", help="model variant (see `probe models`; default baseline)")
    p.add_argument("--tier", default="tiny", help="size tier (default tiny)")
    add_options(p, TrainConfig, SEED_FLAGS)
    p.add_argument(
        "--data",
        default="train",
        help="training corpus (default: the bundled training mix), or "
        "synthetic:bb[vocab=..,triggers=..,seed=..] for an endless Bigram-Backcopy stream (--ctx is its T)",
    )
    p.add_argument("--tokenizer", default="probe-bpe-8k", help="tokenizer (default probe-bpe-8k)")
    p.add_argument(
        "--bos",
        action="store_true",
        help="every training window starts with BOS (the tokenizer's, else "
        "its EOS); recorded in the run, so analyses of the model start their windows with it too",
    )
    add_options(p, TrainConfig, SIZE_FLAGS)
    p.add_argument(
        "--ctx",
        type=positive_int,
        help="tokens per window, and the saved model's context (n_ctx: its default evaluation windows, sigmoid's "
        "b = -log n_ctx); default: the tier's context",
    )
    add_options(p, TrainConfig, LOOP_FLAGS)
    p.add_argument(
        "--eval-data",
        default="heldout",
        help="validation corpus: heldout = 5%% of --data's documents "
        "(smallest SHA-256), never sampled for training; or any --data name, e.g. wikitext-2-test "
        "(default heldout)",
    )
    p.add_argument("--eval-batches", type=positive_int, default=8, help="held-out batches of 8 windows (default 8)")
    add_options(p, TrainConfig, DEVICE_FLAGS)
    p.add_argument("--threads", type=threads, help="CPU threads for torch (default: torch's choice)")
    p.add_argument("--out", metavar="DIR", required=True, help="run directory (required)")
    p.add_argument("--json", action="store_true", help="print the final metrics as JSON on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress bars or notes on stderr")
    folder_flags(p, reads_data=True)
    return p


# The run's identity: the flags that determine the weights, which must match to resume (the others, MAY_CHANGE, may
# differ). Every run records FIRST_KEYS; LATER_KEYS and --bos came after runs were written without them, and such a
# run was trained with their defaults (LATER_DEFAULTS).
FIRST_KEYS = (
    "variant",
    "tier",
    "seed",
    "data",
    "tokenizer",
    "batch_size",
    "ctx",
    "lr",
    "warmup",
    "eval_data",
    "eval_batches",
)
LATER_KEYS = ("schedule", "min_lr_ratio", "optimizer", "muon_lr", "weight_decay", "grad_clip", "z_loss", "grad_accum")
LATER_DEFAULTS = {**{k: getattr(TrainConfig, k) for k in LATER_KEYS}, "bos": False}
RUN_KEYS = FIRST_KEYS + tuple(LATER_DEFAULTS)
MAY_CHANGE = (
    "steps",
    "eval_every",
    "ckpt_every",
    "snapshot_every",
    "device",
    "flush_denormal",
    "threads",
    "out",
    "json",
    "quiet",
    "self_contained",
    "wait",
    "skip_bad_records",
)


def _run_identity(args: argparse.Namespace, ctx: int, task: BigramBackcopy | None) -> dict:
    """The flags that determine the weights; synthetic data records its canonical name and its chain (``task``), which
    is also what an analysis of the model reads as its default --data (``probe.jobs.inputs.trained_task``)."""
    ident = {k: vars(args)[k] for k in RUN_KEYS}
    ident["ctx"] = ctx
    if task is not None:  # BOS-first windows of ids: no tokenizer, validation on the chain's own windows
        ident.update(
            data=task.spec(), tokenizer=None, eval_data=None, bos=True, task=task.to_identity(), bos_id=task.bos_id
        )
    return ident


def _synthetic_task(args: argparse.Namespace) -> BigramBackcopy | None:
    """--data synthetic:bb[...] as a task (--ctx is its T), else None."""
    from probe.data.synthetic import is_synthetic, parse_synthetic

    if not is_synthetic(args.data):
        return None
    try:
        task = parse_synthetic(args.data)
        return dataclasses.replace(task, T=args.ctx) if args.ctx else task
    except ValueError as e:
        raise UsageError(f"--data / --ctx: {first_line(e)}") from None


def _recorded_identity(out: Path) -> dict:
    """The run's recorded identity; a damaged file is one line naming it and how to recover."""
    from probe.jobs.store import _read_state

    return _read_state(out / RUN_IDENTITY, "restore it, or choose another --out (or delete this one) to start over")


def _check_corpus(out: Path, ident: dict, corpus, resuming: bool) -> None:
    """Resume trusts the corpus's content, not its path (docs/definitions.md#resume-fingerprints): the SHA-256 and
    size of what the run trains on are recorded; a changed corpus refuses the resume, naming both fingerprints, and a
    run recorded before fingerprints existed resumes with a warning and records them."""
    ident["corpus_sha256"], ident["corpus_bytes"] = corpus.content["sha256"], corpus.content["bytes"]
    if not resuming:
        return
    old = _recorded_identity(out)
    if "corpus_sha256" not in old:
        stderr_note(
            f"probe train: warning: {out / RUN_IDENTITY} records no corpus fingerprint (written before "
            f"fingerprints existed); resuming on what --data {ident['data']!r} holds now, sha256 "
            f"{ident['corpus_sha256'][:16]}..., and recording it"
        )
        return
    if (old["corpus_sha256"], old.get("corpus_bytes")) != (ident["corpus_sha256"], ident["corpus_bytes"]):
        raise UsageError(
            f"--data {ident['data']!r} changed since the run in --out {str(out)!r} started: its corpus "
            f"was sha256 {old['corpus_sha256'][:16]}... ({old.get('corpus_bytes')} bytes), now "
            f"{ident['corpus_sha256'][:16]}... ({ident['corpus_bytes']} bytes); restore the corpus to "
            "resume, or choose another --out"
        )


def _check_run_dir(out: Path, ident: dict) -> bool:
    """True when ``out`` holds a run with the same identity (resume); errors for a different run or foreign files."""
    if not out.exists():
        return False
    if not out.is_dir():
        raise UsageError(f"--out {str(out)!r} is a file, not a run directory")
    run = out / RUN_IDENTITY
    if not run.is_file():
        from probe.jobs.lock import LOCK_NAME
        from probe.writes import TEMP_PREFIX

        # the lock this run holds and the temp files of its ranks (torchrun: each writes its token stream) are no
        # foreign files
        if any(p.name != LOCK_NAME and not p.name.startswith(TEMP_PREFIX) for p in out.iterdir()):
            raise UsageError(
                f"--out {str(out)!r} exists and is not a `probe train` run directory; choose a new or empty directory"
            )
        return False
    old = {**LATER_DEFAULTS, **_recorded_identity(out)}
    diff = [f"--{k.replace('_', '-')} {old.get(k)!r} (now {v!r})" for k, v in ident.items() if old.get(k) != v]
    if diff:
        raise UsageError(
            f"--out {str(out)!r} holds a run with different settings: {'; '.join(diff)}; resume with "
            "the same flags or choose another --out"
        )
    return True


def _corpora(args: argparse.Namespace):
    """(training corpus, validation corpus): by default the validation documents are held out of --data."""
    from probe.data import HELDOUT, split_heldout
    from probe.jobs.inputs import load_corpus

    corpus = load_corpus(args.data)
    if args.eval_data != HELDOUT:
        return corpus, load_corpus(args.eval_data, "--eval-data")
    try:
        return split_heldout(corpus)
    except ValueError as e:
        raise UsageError(f"--data {args.data!r}: {e} with --eval-data CORPUS") from None


def _tokenizer(args: argparse.Namespace, config):
    from probe.data import load_tokenizer

    try:
        tok = load_tokenizer(args.tokenizer)
    except Exception as e:  # noqa: BLE001
        raise UsageError(f"--tokenizer {args.tokenizer!r}: {first_line(e)}") from None
    if len(tok) > config.vocab_size:
        raise UsageError(
            f"--tokenizer {args.tokenizer!r} has {len(tok)} tokens but tier {args.tier!r} has a "
            f"vocabulary of {config.vocab_size}; choose a matching tokenizer or tier"
        )
    return tok


def _config(args: argparse.Namespace):
    """The model config of --variant and --tier."""
    from probe.models import config_for

    try:
        return config_for(args.variant, args.tier)
    except ValueError as e:
        raise UsageError(
            f"--variant {args.variant!r} / --tier {args.tier!r}: {first_line(e).split(': ', 1)[-1]}"
        ) from None


def _window_length(args: argparse.Namespace, config, task: BigramBackcopy | None, world_size: int) -> int:
    """Tokens per window (a synthetic task's T, else --ctx, else the tier's context), checked against the tier; and
    --batch-size checked to split into equal micro-batches over the processes and --grad-accum."""
    ctx = task.T if task is not None else args.ctx or config.n_ctx
    if ctx > config.n_ctx:
        raise UsageError(
            f"--ctx {ctx} exceeds the maximum context {config.n_ctx} of tier {args.tier!r}; choose "
            f"--ctx 2..{config.n_ctx}"
        )
    if ctx < 2:
        raise UsageError(f"--ctx {ctx} is too short; choose --ctx 2..{config.n_ctx}")
    if args.batch_size % (world_size * args.grad_accum):
        raise UsageError(
            f"--batch-size {args.batch_size} does not split into {world_size} process(es) x "
            f"--grad-accum {args.grad_accum} equal micro-batches; choose a --batch-size that is a "
            f"multiple of {world_size * args.grad_accum}"
        )
    from probe.train.trainer import check_batch_fits

    try:
        check_batch_fits(args.batch_size, ctx, config.vocab_size, world_size * args.grad_accum)
    except ValueError as e:
        raise UsageError(str(e)) from None
    return ctx


def _tokens(args: argparse.Namespace, config, task: BigramBackcopy | None, ident: dict):
    """(tokenizer, BOS id): none for synthetic data, whose ids must fit the tier's vocabulary; with --bos the
    tokenizer's BOS, else its EOS (probe-bpe-8k has no BOS token), recorded in the run's identity."""
    if task is not None:
        if task.vocab_size > config.vocab_size:
            raise UsageError(
                f"--data {task.spec()!r} needs {task.vocab_size} token ids but tier {args.tier!r} has a "
                f"vocabulary of {config.vocab_size}; choose a smaller vocab or another tier"
            )
        return None, None
    tok = _tokenizer(args, config)
    if not args.bos:
        return tok, None
    ident["bos_id"] = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
    return tok, ident["bos_id"]


def _corpus_windows(args: argparse.Namespace, console, tok, ctx: int, bos_id, vocab_size: int, out: Path, check):
    """(training sampler, validation windows, what the validation is) of --data and --eval-data, under a tokenizing
    bar; ``check(corpus)`` sees the training corpus first, then the validation windows are built, then the training
    corpus is tokenized. A local file's tokens go to a temporary file in --out (the
    same stream, not held in memory)."""
    from probe.data import WindowSampler, tokenize_documents
    from probe.data.batches import token_stream
    from probe.jobs.inputs import make_windows
    from probe.progress import plural

    # the validation windows first: their errors (too few documents, too many windows) then come without the wait
    # for the whole training corpus to tokenize
    bar = console.bar(2, f"train: tokenizing {args.eval_data}", unit="corpus", leave=False)
    try:
        corpus, eval_corpus = _corpora(args)
        check(corpus)
        eb = make_windows(
            eval_corpus,
            tok,
            n_batches=args.eval_batches,
            batch_size=8,
            ctx=ctx,
            seed=args.seed,
            mode="auto",
            vocab_size=vocab_size,
            bos_id=bos_id,
        )
        bar.update()
        bar.set_description(f"train: tokenizing {args.data}")
        streamed = hasattr(corpus.documents, "pieces")
        docs = None if streamed else tokenize_documents(corpus, tok)
        stream = token_stream(corpus.documents, tok, tok.eos_token_id, out) if streamed else None
        try:
            sampler = WindowSampler(docs, ctx, args.seed, eos_id=tok.eos_token_id, bos_id=bos_id, stream=stream)
        except ValueError as e:
            raise UsageError(f"--data {args.data!r}: {e}") from None
        bar.update()
    finally:
        bar.close()
    return sampler, eb, f"{eval_corpus.name} ({plural(len(eval_corpus.documents), 'document')})"


def _finish(args: argparse.Namespace, model, out: Path, ident: dict, start: int, last: dict | None, tok) -> None:
    """The main process's end of a run: the final model (exported unless this run added no step to one already
    there), the training page, and the final metrics on stdout."""
    from probe.present.training import training_text, write_training_page
    from probe.train import export_model, read_metrics

    model_dir = out / FINAL_MODEL
    if start < args.steps or not (model_dir / MODEL_CONFIG).exists():
        export_model(model, model_dir, tok)
    write_training_page(out, f"{args.tier}-{args.variant}", ident, read_metrics(out), args.self_contained)
    result = {**(last or {}), "steps": args.steps, "model_dir": str(model_dir)}
    print(json.dumps(result, indent=1) if args.json else training_text(result, out))


def run(args: argparse.Namespace) -> int:
    from probe.console import Console
    from probe.data import HELDOUT
    from probe.jobs.inputs import check_data, resolve_device, set_threads
    from probe.models import create
    from probe.progress import plural
    from probe.train import find_checkpoint, train
    from probe.train.checkpoint import read_state
    from probe.train.distributed import from_env
    from probe.train.trainer import capped_warmup
    from probe.writes import atomic_write

    console = Console(args.quiet)
    check_data(args.data)
    if args.eval_data != HELDOUT:
        check_data(args.eval_data, "--eval-data")
    config = _config(args)
    task = _synthetic_task(args)
    dist = from_env()  # under torchrun only rank 0 checks, writes and reports
    ctx = _window_length(args, config, task, dist.world_size)
    out = Path(args.out)
    ident = _run_identity(args, ctx, task)
    resuming = _check_run_dir(out, ident) if dist.is_main else False
    set_threads(args.threads)
    device = resolve_device(args.device)
    tok, bos_id = _tokens(args, config, task, ident)
    if task is not None:  # an infinite stream of BB sequences; validation on fixed windows of the same chain
        sampler, eb = task.sampler(args.seed), task.eval_windows(args.eval_batches, 8)
        validation = f"{plural(args.eval_batches * 8, 'sequence')} of the same chain"
    else:
        check = (lambda corpus: _check_corpus(out, ident, corpus, resuming)) if dist.is_main else (lambda corpus: None)
        sampler, eb, validation = _corpus_windows(args, console, tok, ctx, bos_id, config.vocab_size, out, check)
    warmup = capped_warmup(args.warmup, args.steps)  # said once the data are known good: an error is the only line
    if warmup != args.warmup:
        console.note(
            f"warning: --warmup {args.warmup} >= --steps {args.steps}, so the lr would never reach its peak; "
            f"warming up for {plural(warmup, 'step')} instead"
        )
    # the model's context is the one it trains at: its default evaluation windows, and sigmoid's b = -log n_ctx
    model = create(args.variant, args.tier, seed=args.seed, n_ctx=ctx)
    # every evaluation on all the --eval-batches windows built (TrainConfig's cap of 16 made a longer curve mix two
    # window sets: its last point on all of them, the others on the first 16)
    settings = {k: getattr(args, k) for k in CONFIG_FLAGS}
    cfg = TrainConfig(**{**settings, "warmup": warmup, "device": device, "eval_batches": args.eval_batches})
    n_params = sum(p.numel() for p in model.parameters())
    ckpt = find_checkpoint(out) if resuming else None
    try:
        start = read_state(ckpt)["step"] if ckpt else 0
    except ValueError as e:
        raise UsageError(f"--out {str(out)!r}: {e}") from None
    if start > args.steps:  # its model is past the steps asked for: never reported as a shorter run
        raise UsageError(
            f"--steps {args.steps}: the run in {str(out)!r} has trained {start} steps already; pass --steps {start} or "
            "more to resume it, or choose another --out"
        )
    if dist.is_main:
        console.note(
            f"plan: train {args.tier}-{args.variant} ({n_params:,} parameters) on {ident['data']} for "
            f"{plural(args.steps, 'step')} x {plural(args.batch_size, 'window')} x {ctx} tokens"
            f"{' (BOS first)' if ident['bos'] else ''}; validation on {validation}"
            + (f"; resuming from step {start}" if ckpt else "")
            + f"; run directory {out}"
        )
        out.mkdir(parents=True, exist_ok=True)
        atomic_write(out / RUN_IDENTITY, json.dumps(ident, indent=1))
    last = train(model, sampler, cfg, out, eval_batches=eb, resume=True, progress=not args.quiet, tokenizer=tok)
    if dist.is_main:
        _finish(args, model, out, ident, start, last, tok)
    return 0
