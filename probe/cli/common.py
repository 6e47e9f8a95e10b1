"""What the ``probe`` verbs share: user errors, notes and bars, model, tokenizer and window loading.

Nothing heavy is imported at module level (``probe --help`` imports this module); torch, pandas, plotly and
transformers are imported inside the functions that need them.
"""
from __future__ import annotations

import difflib
import os
import sys
from pathlib import Path

# The embedded default models: zoo checkpoints (issue #7) when installed, else a freshly initialised tiny model of the
# same variant built in-process (seed 0). Switching to another zoo name is a one-line change here.
DEFAULT_MODEL = "probe/tiny-sink+proj"
DEFAULT_DEPTH_MODEL = "probe/tiny-attnres-block4"  # `probe sources` needs depth routing
DEFAULT_TOKENIZER = "probe-bpe-8k"


class UsageError(Exception):
    """A user error: printed as one line on stderr, exit code 2."""

    def __init__(self, message: str, prog: str = "probe"):
        super().__init__(message)
        self.prog = prog

    def one_line(self) -> str:
        return " ".join(str(self).split())


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


class Console:
    """Notes (stderr) and tqdm bars, silent with --quiet. Results go to stdout."""

    def __init__(self, quiet: bool = False):
        self.quiet = quiet
        if quiet:
            import warnings

            warnings.simplefilter("ignore")
            os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
            os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

    def note(self, msg: str) -> None:
        """A line on stderr that does not collide with an active progress bar."""
        if not self.quiet:
            from tqdm import tqdm

            tqdm.write(msg, file=sys.stderr)

    def bar(self, total: int, desc: str, unit: str = "it", leave: bool = True):
        """A tqdm bar on stderr; ``leave=False`` bars (loading stages) erase themselves when closed, so an error
        that follows them is the only line left on the terminal."""
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=desc, unit=unit, disable=self.quiet, file=sys.stderr, dynamic_ncols=True,
                    leave=leave)


# ------------------------------------------------------------------------------------------------------------ checks


def check_data(name: str, flag: str = "--data") -> None:
    """Fail fast (before loading a model) on a corpus that is neither bundled, online (hf:) nor an existing path."""
    from probe.data.corpus import CORPORA

    bundled = [k for k in CORPORA if not k.startswith("hf:")]
    if name in bundled or name.startswith("hf:") or Path(name).expanduser().exists():
        return
    raise UsageError(f"{flag} {name!r}: no such bundled corpus, file or directory; choose one of "
                     f"{', '.join(bundled)}, an existing .txt or .jsonl[.gz] file or directory, or "
                     "hf:wikitext-2-raw-v1:<split>")


def set_threads(n: int | None) -> None:
    if n:
        import torch

        torch.set_num_threads(n)


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise UsageError(f"--device {device!r} is not a device; use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {device!r}: CUDA is not available on this machine; use --device cpu")
    return str(dev)


KNOWN_HINT = ("see `probe models`: zoo names probe/tiny-<variant>, pythia-14m ... pythia-12b[-deduped][@stepN], "
              "gpt-oss-20b, gpt-oss-120b, an HF repo id, a local model directory, a `probe train` run directory[@stepN] or a .gguf file")


def load_model(args, default: str, console: Console):
    """The model of ``--model`` (or the embedded default), on ``--device`` in ``--dtype``, in eval mode."""
    import probe.checkpoints.load as L

    set_threads(args.threads)
    device = resolve_device(args.device)
    dtype = None if args.dtype == "auto" else args.dtype
    name = args.model
    if name is None:
        try:
            L.resolve(default)
            name = default
        except L.ModelNotFoundError:
            return fresh_default(default, device, dtype, console)
    try:
        _, _, kind = L.resolve(name)
    except L.ModelNotFoundError as e:
        raise UsageError(f"--model {name!r}: {e}") from None
    except ValueError as e:
        raise UsageError(f"--model {name!r}: {e}; {KNOWN_HINT}") from None
    if kind != "hub":  # local weights load in moments: our loading bar is enough (hub downloads keep their bars)
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    try:
        model = L.load(name, device=device if device != "cpu" else None, dtype=dtype)
    except L.ModelNotFoundError as e:
        close = difflib.get_close_matches(name.split("@")[0], list(L.KNOWN_CHECKPOINTS), n=1)
        hint = f"did you mean {close[0]}? " if close and close[0] != name.split("@")[0] else ""
        raise UsageError(f"--model {name!r}: {e}; {hint}{KNOWN_HINT}") from None
    except Exception as e:  # noqa: BLE001 — an unreadable checkpoint of any kind is a user error, one line
        raise UsageError(f"--model {name!r}: cannot read the {kind} checkpoint ({first_line(e)})") from None
    return model.eval()


def fresh_default(default: str, device: str, dtype, console: Console):
    import torch

    from probe.models import create

    variant = default.split("tiny-", 1)[1]
    console.note(f"model: zoo checkpoint {default} is not installed; using a freshly initialised tiny {variant} "
                 f"(seed 0, untrained)")
    model = create(variant, "tiny", seed=0)
    model.probe_name = f"tiny-{variant} (fresh init, seed 0)"
    if dtype is not None:
        model = model.to(getattr(torch, dtype))
    return model.to(device).eval()


def tokenizer_for(args, model):
    from probe.data.tokenizer import TOKENIZERS, load_tokenizer

    name = getattr(args, "tokenizer", None)
    if name is None:
        if getattr(model, "tokenizer", None) is not None:
            return model.tokenizer
        if model.probe_info.family != "probe":
            raise UsageError(f"model {model.probe_info.name!r} ships no tokenizer; pass --tokenizer "
                             f"({', '.join(TOKENIZERS)})")
        name = DEFAULT_TOKENIZER
    try:
        return load_tokenizer(name)
    except Exception as e:  # noqa: BLE001
        raise UsageError(f"--tokenizer {name!r}: {first_line(e)}; choose one of {', '.join(TOKENIZERS)}") from None


def load_corpus(name: str, flag: str = "--data"):
    from probe.data import load_corpus as _load

    check_data(name, flag)
    try:
        return _load(name)
    except (OSError, ValueError, ImportError, UnicodeDecodeError) as e:
        raise UsageError(f"{flag} {name!r}: {first_line(e)}") from None


def eval_ctx(args, model) -> int:
    from probe.data import cap_ctx

    info = model.probe_info
    n_ctx = info.n_ctx
    if args.ctx is None and info.family == "probe":
        return n_ctx  # custom models: their training context (SPEC §5); HF checkpoints: min(1024, maximum)
    try:
        return cap_ctx(args.ctx, n_ctx)
    except ValueError:
        raise UsageError(f"--ctx {args.ctx} exceeds the maximum context {n_ctx} of model "
                         f"{info.name!r}; choose --ctx 2..{n_ctx}") from None


def make_windows(corpus, tok, *, n_batches: int, batch_size: int, ctx: int, seed: int, mode: str, vocab_size: int,
                 docs=None):
    """Fixed evaluation windows; mode auto = one window per document (first), else sequential windows."""
    import dataclasses

    from probe.data import eval_batches, tokenize_documents

    if mode == "random" and tok.eos_token_id is None:
        raise UsageError(f"--window-mode random joins documents with EOS, but tokenizer {tok.name_or_path!r} has no "
                         "eos token; use --window-mode first or sequential")
    docs = tokenize_documents(corpus, tok) if docs is None else docs
    last = None
    for m in (("first", "sequential") if mode == "auto" else (mode,)):
        try:
            eb = eval_batches(docs, tok, n_batches=n_batches, batch_size=batch_size, ctx=ctx, seed=seed, mode=m)
            break
        except ValueError as e:
            last = e
    else:
        msg = str(last)
        for a, b in (("corpus 'custom-tokens' ", "it "), ("n_batches*batch_size", "--batches x --batch-size"),
                     ("mode='sequential' or 'random'", "--window-mode sequential or random"),
                     ("mode='random'", "--window-mode random")):
            msg = msg.replace(a, b)
        raise UsageError(f"--data {corpus.name!r}: {msg}")
    eb = dataclasses.replace(eb, corpus=corpus.name, corpus_fingerprint=corpus.fingerprint)
    top = int(eb.tokens.max())
    if top >= vocab_size:
        raise UsageError(f"tokenizer {eb.tokenizer!r} produces token id {top}, beyond the model's vocabulary of "
                         f"{vocab_size}; pass a matching --tokenizer")
    return eb


def windows_for(args, model, console: Console):
    """Model-specific windows of ``--data`` (its tokenizer and context) on its device: (windows, tokenizer)."""
    import dataclasses

    tok = tokenizer_for(args, model)
    ctx = eval_ctx(args, model)
    corpus = load_corpus(args.data)
    eb = make_windows(corpus, tok, n_batches=args.batches, batch_size=args.batch_size, ctx=ctx, seed=args.seed,
                      mode=args.window_mode, vocab_size=model.probe_info.vocab_size)
    device = next(model.parameters()).device
    return dataclasses.replace(eb, tokens=eb.tokens.to(device)), tok


def plan_line(verb: str, model, eb, passes: int = 1, what: str = "") -> str:
    n = eb.tokens.shape[0] * eb.tokens.shape[1]
    extra = f" x {passes} forward passes ({what})" if passes > 1 else ""
    return (f"plan: {verb} on {model.probe_info.name} — {eb.tokens.shape[0]} batches x {eb.tokens.shape[1]} windows "
            f"x {eb.ctx} tokens ({n} windows, {eb.corpus}, {eb.mode}){extra}")
