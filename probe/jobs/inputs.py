"""What an analysis runs on, built from typed specs: the model (``ModelSpec``), its evaluation windows
(``WindowSpec``) and the injection conditions that apply to it (``InjectionSpec``), for the CLI verbs, ``probe
report`` and the pretrained-model recipes.

Windows are built by ``probe.data.windows`` (docs/definitions.md#evaluation-windows, docs/definitions.md#bos-rule);
here they get the model's tokenizer and the flags' names in their errors, and a :class:`WindowCache` reads the corpus
and tokenizes it once for every model of a run.

Every failure a user can cause here (a missing corpus, an unknown model, an unreadable checkpoint, a tokenizer that
does not fit, a context the model cannot take, a device that is not there) is a one-line :class:`UsageError` naming
the flag, raised before any output is written.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import tempfile
import weakref
from pathlib import Path

import torch

from probe.analyses.capture import model_device
from probe.analyses.inject import JUNK_TYPES, own_directions
from probe.checkpoints.load import ModelNotFoundError, load, resolve
from probe.console import Console
from probe.data import load_corpus as read_corpus
from probe.data.batches import DocumentTokens
from probe.data.corpus import CORPORA
from probe.data.synthetic import BigramBackcopy, is_synthetic, is_token_domain, parse_synthetic, parse_token_domain
from probe.data.tokenizer import DEFAULT_TOKENIZER, TOKENIZERS, load_tokenizer
from probe.data.windows import build_windows, eval_context, text_windows, window_bos_id
from probe.errors import UsageError, first_line
from probe.jobs.model_names import model_error
from probe.jobs.specs import InjectionSpec, ModelSpec, WindowSpec
from probe.models import create
from probe.progress import plural

DEFAULT_DATA = "wikitext-2-test"  # windows of text models when --data is not given


# ------------------------------------------------------------------------------------------------------------ checks


def check_data(name: str | None, flag: str = "--data") -> None:
    """Fail fast (before loading a model) on a corpus that is neither bundled, online (hf:), synthetic (a well-formed
    synthetic:bb[...] name) nor an existing path. None (the model's default data) is always fine."""
    if name is None:
        return
    for is_kind, parse in ((is_token_domain, parse_token_domain), (is_synthetic, parse_synthetic)):
        if is_kind(name):  # a token domain or a synthetic name: well-formed is enough
            try:
                parse(name)
            except ValueError as e:
                raise UsageError(f"{flag}: {e}") from None
            return
    bundled = [k for k in CORPORA if not k.startswith("hf:")]
    if name in bundled or name.startswith("hf:") or Path(name).expanduser().exists():
        return
    raise UsageError(
        f"{flag} {name!r}: no such bundled corpus, file or directory; choose one of "
        f"{', '.join(bundled)}, an existing .txt or .jsonl[.gz] file or directory, "
        "hf:wikitext-2-raw-v1:<split>, synthetic:bb[...], synthetic:random[...] or synthetic:repeat[...]"
    )


def set_threads(n: int | None) -> None:
    if n:
        torch.set_num_threads(n)


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise UsageError(f"--device {device!r} is not a device; use auto, cpu, cuda or cuda:N") from None
    if dev.type not in ("cpu", "cuda", "mps"):  # meta holds no data: a run on it computes nothing
        raise UsageError(f"--device {device!r} is not a device probe runs on; use auto, cpu, cuda, cuda:N or mps")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {device!r}: CUDA is not available on this machine; use --device cpu")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise UsageError(f"--device {device!r}: this machine has GPUs 0..{torch.cuda.device_count() - 1}")
    return str(dev)


# ------------------------------------------------------------------------------------------------------------ model


def load_model(spec: ModelSpec, console: Console, flag: str = "--model"):
    """The model of ``spec.name`` (or the embedded default), on its device in its dtype, in eval mode; errors name
    ``flag`` (the one that gave the name)."""
    set_threads(spec.threads)
    device = resolve_device(spec.device)
    dtype = None if spec.dtype == "auto" else spec.dtype
    name = spec.name
    if name is None:
        try:
            resolve(spec.default)
            name = spec.default
        except ModelNotFoundError:
            return fresh_default(spec.default, device, dtype, console)
    try:
        _, _, kind = resolve(name)
    except ValueError as e:  # ModelNotFoundError too
        raise model_error(flag, name, e) from None
    placed, offload_tmp = placement(spec)
    # accelerate warns that offloaded weights sit on 'meta' (expected here); probe says where the layers went instead
    offload_log = logging.getLogger("accelerate.big_modeling")
    level = offload_log.level
    offload_log.setLevel(logging.ERROR)
    try:
        model = load(name, device=None if placed or device == "cpu" else device, dtype=dtype, **placed)
    except ModelNotFoundError as e:
        raise model_error(flag, name, e) from None
    except Exception as e:  # noqa: BLE001 — an unreadable checkpoint of any kind is a user error, one line
        if placed:
            raise UsageError(
                f"{flag} {name!r} with --device-map {placed['device_map']!r}"
                f"{' --max-memory ' + str(spec.max_memory) if spec.max_memory else ''}: cannot place "
                f"it ({first_line(e)})"
            ) from None
        raise UsageError(f"{flag} {name!r}: cannot read the {kind} checkpoint ({first_line(e)})") from None
    finally:
        offload_log.setLevel(level)
    if placed:
        device_map = getattr(getattr(model, "hf_model", model), "hf_device_map", None) or {}
        where = collections.Counter(str(d) for d in device_map.values())
        console.note(
            f"placement: --device-map {placed['device_map']}: "
            + ", ".join(f"{plural(n, 'module')} on {d}" for d, n in where.items())
        )
    if offload_tmp is not None:  # the temporary folder lives as long as the model, and is removed after it
        weakref.finalize(model, offload_tmp.cleanup)
    return model.eval()


def placement(spec: ModelSpec) -> tuple[dict, tempfile.TemporaryDirectory | None]:
    """``from_pretrained`` keywords that spread the model over devices with accelerate (--device-map, --max-memory,
    --offload-dir; either of the last two alone means --device-map auto), or {} to load it whole on --device; and the
    temporary offload folder to keep alive while the model is used (None with --offload-dir)."""
    if spec.device_map is None and spec.max_memory is None and spec.offload_dir is None:
        return {}, None
    if spec.device != "auto":
        raise UsageError(f"--device {spec.device!r} and --device-map both place the model; give one of them")
    gpus = torch.cuda.device_count()
    missing = [k for k in spec.max_memory or {} if isinstance(k, int) and k >= gpus]
    if missing:
        have = f"GPUs 0..{gpus - 1}, " if gpus else "no GPU: "
        raise UsageError(f"--max-memory: GPU {missing[0]} is not on this machine ({have}use cpu, disk)")
    # offloaded weights are written here while the model loads and read at every forward pass
    tmp = None if spec.offload_dir else tempfile.TemporaryDirectory(prefix="probe-offload-")
    placed = {"device_map": spec.device_map or "auto", "offload_folder": spec.offload_dir or tmp.name}
    if spec.max_memory:
        placed["max_memory"] = dict(spec.max_memory)
    return placed, tmp


def fresh_default(default: str, device: str, dtype, console: Console):
    """A freshly initialised tiny model of the default's variant (seed 0), when that zoo checkpoint is not installed."""
    variant = default.split("tiny-", 1)[1]
    console.note(
        f"model: zoo checkpoint {default} is not installed; using a freshly initialised tiny {variant} "
        f"(seed 0, untrained)"
    )
    model = create(variant, "tiny", seed=0)
    model.probe_name = f"tiny-{variant} (fresh init, seed 0)"
    if dtype is not None:
        model = model.to(getattr(torch, dtype))
    return model.to(device).eval()


# ------------------------------------------------------------------------------------------------------------ windows


def tokenizer_for(spec: WindowSpec, model):
    """``spec.tokenizer``, else the model's own, else (probe models only) the shipped default."""
    name = spec.tokenizer
    if name is None:
        if getattr(model, "tokenizer", None) is not None:
            return model.tokenizer
        if model.probe_info.family != "probe":
            # the loader says why there is none: it ships none, or ships one that cannot be read
            why = getattr(model, "tokenizer_problem", None) or "ships no tokenizer"
            raise UsageError(f"model {model.probe_info.name!r} {why}; pass --tokenizer ({', '.join(TOKENIZERS)})")
        name = DEFAULT_TOKENIZER
    try:
        return load_tokenizer(name)
    except Exception as e:  # noqa: BLE001
        raise UsageError(f"--tokenizer {name!r}: {first_line(e)}; choose one of {', '.join(TOKENIZERS)}") from None


def load_corpus(name: str, flag: str = "--data"):
    check_data(name, flag)
    try:
        return read_corpus(name)
    except (OSError, ValueError, ImportError, UnicodeDecodeError) as e:
        raise UsageError(f"{flag} {name!r}: {first_line(e)}") from None


def eval_ctx(spec: WindowSpec, model) -> int:
    """Tokens per window: ``spec.ctx`` (at most the model's maximum unless ``spec.past_context``), else the model's
    evaluation context."""
    if spec.past_context and spec.ctx is not None and spec.ctx >= 2:
        return spec.ctx
    try:
        return eval_context(model, spec.ctx)
    except ValueError:
        info = model.probe_info
        why = "is too short" if spec.ctx < 2 else f"exceeds the maximum context {info.n_ctx} of model {info.name!r}"
        raise UsageError(f"--ctx {spec.ctx} {why}; choose --ctx 2..{info.n_ctx}") from None


def bos_id_for(spec: WindowSpec, model, tok) -> int | None:
    """The BOS id that starts each window, or None: ``spec.bos``, or docs/definitions.md#bos-rule when it is None
    (``probe.data.windows.window_bos_id``)."""
    try:
        return window_bos_id(model, tok, spec.bos)
    except ValueError:
        raise UsageError(f"--bos: tokenizer {tok.name_or_path!r} has no BOS token; drop --bos") from None


def make_windows(
    corpus,
    tok,
    *,
    n_batches: int,
    batch_size: int,
    ctx: int,
    seed: int,
    mode: str,
    vocab_size: int,
    docs=None,
    bos_id: int | None = None,
):
    """``probe.data.windows.build_windows`` (mode auto = one window per document, sequential windows when there are
    too few; with ``bos_id`` each window is that BOS + ctx-1 text tokens of input), its errors naming the flags."""
    try:
        return build_windows(
            corpus,
            tok,
            n_batches=n_batches,
            batch_size=batch_size,
            ctx=ctx,
            seed=seed,
            mode=mode,
            bos_id=bos_id,
            docs=docs,
            vocab_size=vocab_size,
        )
    except ValueError as e:
        msg = str(e)
        for a, b in (
            (f"corpus {corpus.name!r} ", "it "),
            ("n_batches*batch_size", "--batches x --batch-size"),
            ("mode='sequential' or 'random'", "--window-mode sequential or random"),
            ("mode='random'", "--window-mode random"),
            ("mode='packed'", "--window-mode packed"),
            ("mode='first' or 'sequential'", "--window-mode first or sequential"),
            ("a matching tokenizer", "a matching --tokenizer"),
        ):
            msg = msg.replace(a, b)
        raise UsageError(f"--data {corpus.name!r}: {msg}") from None


def trained_task(model) -> BigramBackcopy | None:
    """The synthetic task a model was trained on (recorded by its run, ``probe.runs.training_record``), else None."""
    record = getattr(model, "train_record", None) or {}
    return BigramBackcopy.from_identity(record["task"]) if record.get("task") else None


def synthetic_windows(spec: WindowSpec, model, task: BigramBackcopy | None):
    """Fixed Bigram-Backcopy windows of ``spec.data`` (bare ``synthetic:bb``: the model's recorded chain), BOS first,
    ``--ctx`` tokens (default: the chain's T) after it."""
    name = spec.data or "synthetic:bb"
    info = model.probe_info
    if task is None:
        raise UsageError(
            f"--data {name!r} is Bigram-Backcopy data but model {info.name!r} was trained on text; pass "
            "a text corpus (e.g. wikitext-2-test), or a model trained with --data synthetic:bb"
        )
    try:
        asked = parse_synthetic(name, base=task)
        if spec.ctx is not None:
            asked = dataclasses.replace(asked, T=spec.ctx)
    except ValueError as e:
        raise UsageError(f"--data / --ctx: {first_line(e)}") from None
    if spec.tokenizer is not None:
        raise UsageError(
            f"--tokenizer {spec.tokenizer!r} does not apply to --data {name!r} (its tokens are ids); drop --tokenizer"
        )
    if spec.bos is False:
        raise UsageError(f"--no-bos: --data {name!r} windows always start with BOS; drop --no-bos")
    if asked.vocab_size > info.vocab_size:
        raise UsageError(
            f"--data {asked.spec()!r} needs {asked.vocab_size} token ids but model {info.name!r} has a "
            f"vocabulary of {info.vocab_size}; choose vocab <= {info.vocab_size - 1}"
        )
    if asked.T > info.n_ctx:
        raise UsageError(
            f"--data {asked.spec()!r}: T={asked.T} exceeds the maximum context {info.n_ctx} of model "
            f"{info.name!r}; choose T (or --ctx) 2..{info.n_ctx}"
        )
    try:
        return asked.eval_windows(spec.batches, spec.batch_size, seed=spec.seed)
    except ValueError as e:  # windows that cannot fit in memory: one line naming the flags
        raise UsageError(f"--batches {spec.batches} x --batch-size {spec.batch_size}: {first_line(e)}") from None


def text_on_bb(
    what: str,
    model,
    task: BigramBackcopy,
    hint: str = "use --data synthetic:bb (its own chain) or synthetic:bb[vocab=..,triggers=..,seed=..,T=..]",
) -> UsageError:
    """The one-line error for text given to a model trained on Bigram-Backcopy data; ``what`` names the input."""
    return UsageError(
        f"{what} is text but model {model.probe_info.name!r} was trained on Bigram-Backcopy data "
        f"({task.spec()}); {hint}"
    )


def windows_for(spec: WindowSpec, model, cache: WindowCache | None = None):
    """The model's windows of ``spec.data`` (its tokenizer and context) on its device: (windows, tokenizer). Without
    ``spec.data``: a Bigram-Backcopy model's own chain, else wikitext-2-test. Bigram-Backcopy windows come with no
    tokenizer (None); text on a Bigram-Backcopy model, or BB data on a text model, is an error naming both. With
    ``cache`` (a :class:`WindowCache` of the same ``spec``) text windows are built once for all the models that share a
    tokenizer, context and BOS."""
    task = trained_task(model)
    check_protocol(spec, task)
    if is_token_domain(spec.data):
        return on_device(token_domain_windows(spec, model), model), None
    if is_synthetic(spec.data) or (spec.data is None and task is not None):
        return on_device(synthetic_windows(spec, model, task), model), None
    if task is not None:
        raise text_on_bb(f"--data {spec.data or DEFAULT_DATA!r}", model, task)
    tok = tokenizer_for(spec, model)
    return (cache or WindowCache(spec)).get(model, tok, eval_ctx(spec, model)), tok


def check_protocol(spec: WindowSpec, task: BigramBackcopy | None) -> None:
    """--protocol gu2025 fixes the windows (docs/definitions.md#sink-eps-protocols): the first 64 tokens of each text
    with the tokenizer's default special tokens, one window per text; a flag that asks for other windows is an error."""
    from probe.analyses.sink_heads import GU2025_TOKENS, PROTOCOLS

    if spec.protocol not in PROTOCOLS:
        raise UsageError(f"--protocol {spec.protocol!r}: choose one of {', '.join(PROTOCOLS)}")
    if spec.protocol != "gu2025":
        return
    why = f"--protocol gu2025 reads the first {GU2025_TOKENS} tokens of each text"
    if spec.ctx is not None and spec.ctx != GU2025_TOKENS:
        raise UsageError(f"--ctx {spec.ctx} conflicts with --protocol gu2025 ({why}); drop --ctx")
    if spec.mode != "auto":
        raise UsageError(
            f"--window-mode {spec.mode} conflicts with --protocol gu2025 (one window per text, texts in "
            "order); drop --window-mode"
        )
    if spec.bos is not None:
        raise UsageError(
            f"--{'' if spec.bos else 'no-'}bos conflicts with --protocol gu2025 (the tokenizer's default "
            f"special tokens decide the BOS); drop --{'' if spec.bos else 'no-'}bos"
        )
    if is_token_domain(spec.data):
        T = parse_token_domain(spec.data).T
        if T != GU2025_TOKENS:
            raise UsageError(
                f"--data {spec.data!r}: T={T} conflicts with --protocol gu2025 ({why}); use T={GU2025_TOKENS}"
            )
    elif is_synthetic(spec.data) or (spec.data is None and task is not None):
        raise UsageError(
            f"--protocol gu2025 reads text or synthetic:random / synthetic:repeat, not Bigram-Backcopy "
            f"data ({spec.data or task.spec()}); use --protocol pooled"
        )


def token_domain_windows(spec: WindowSpec, model):
    """Windows of ``synthetic:random[...]`` / ``synthetic:repeat[...]`` for any model: ids over its vocabulary, the
    tokenizer's BOS first only with ``bos=1``; --ctx, --bos, --tokenizer do not apply (the name says T and bos); the
    name's n sequences, else --batches x --batch-size."""
    name, info = spec.data, model.probe_info
    try:  # the name's n, else --batches x --batch-size sequences as for any other data
        domain = parse_token_domain(name, n=spec.batches * spec.batch_size)
    except ValueError as e:
        raise UsageError(f"--data: {first_line(e)}") from None
    for flag, given in (
        ("--ctx", spec.ctx is not None and spec.ctx != domain.T),
        ("--bos", spec.bos is not None),
        ("--tokenizer", spec.tokenizer is not None),
    ):
        if given:
            raise UsageError(f"{flag} does not apply to --data {name!r} (its T and bos are in the name); drop {flag}")
    if domain.T > info.n_ctx:
        raise UsageError(
            f"--data {name!r}: T={domain.T} exceeds the maximum context {info.n_ctx} of model "
            f"{info.name!r}; choose T 2..{info.n_ctx}"
        )
    bos_id, tok = None, getattr(model, "tokenizer", None)
    if domain.bos and tok is not None:
        try:
            bos_id = window_bos_id(model, tok, True)
        except ValueError:
            pass  # no BOS anywhere: TokenDomain.generate says so in one line
    try:
        return domain.windows(info.vocab_size, bos_id, spec.batch_size)
    except ValueError as e:
        raise UsageError(f"--data {name!r}: {first_line(e)}") from None


class WindowCache:
    """Text windows of one ``WindowSpec`` per (tokenizer, context, BOS) for the many models of one run: the corpus is
    opened once, and (held in memory) tokenized once per tokenizer."""

    def __init__(self, spec: WindowSpec):
        self.spec, self._corpus, self.docs, self.cache = spec, None, {}, {}

    @property
    def corpus(self):
        """The run's corpus (``--data``, else the default text), opened on first use and then kept."""
        if self._corpus is None:
            self._corpus = load_corpus(self.spec.data or DEFAULT_DATA)
        return self._corpus

    def fingerprint(self) -> dict | None:
        """The corpus that text windows come from, as resume compares it (docs/definitions.md#resume-fingerprints):
        {"corpus", "sha256", "bytes"}; None for synthetic data (its name is its content)."""
        name = self.spec.data
        if name is not None and name.startswith("synthetic:"):
            return None
        return {"corpus": self.corpus.name, **self.corpus.content}

    def get(self, model, tok, ctx):
        """The model's windows on its device, with ``tok`` and ``ctx`` as :func:`windows_for` picks them (a
        Bigram-Backcopy model, or Bigram-Backcopy data: :func:`windows_for`'s windows or its error)."""
        w = self.spec
        if is_synthetic(w.data) or trained_task(model) is not None:
            return windows_for(w, model)[0]
        check_protocol(w, None)
        if w.protocol == "gu2025":
            return self.texts(model, tok)
        bos_id = bos_id_for(w, model, tok)
        key = (tok.name_or_path, len(tok), ctx, bos_id)
        if key not in self.cache:
            tkey = key[:2]
            if tkey not in self.docs:  # documents in memory are tokenized once; a streamed file as far as asked
                self.docs[tkey] = DocumentTokens(self.corpus, tok)
            self.cache[key] = make_windows(
                self.corpus,
                tok,
                n_batches=w.batches,
                batch_size=w.batch_size,
                ctx=ctx,
                seed=w.seed,
                mode=w.mode,
                vocab_size=model.probe_info.vocab_size,
                docs=self.docs[tkey],
                bos_id=bos_id,
            )
        return on_device(self.cache[key], model)

    def texts(self, model, tok):
        """--protocol gu2025's windows: one per text (the first --batches x --batch-size texts of >= 65 tokens)."""
        from probe.analyses.sink_heads import GU2025_TOKENS

        w = self.spec
        key = ("texts", tok.name_or_path, len(tok))
        if key not in self.cache:
            try:
                self.cache[key] = text_windows(
                    self.corpus,
                    tok,
                    n=w.batches * w.batch_size,
                    ctx=GU2025_TOKENS,
                    batch_size=w.batch_size,
                    vocab_size=model.probe_info.vocab_size,
                )
            except ValueError as e:
                raise UsageError(f"--data {self.corpus.name!r}: {first_line(e)}") from None
        return on_device(self.cache[key], model)


def on_device(eb, model):
    """The windows with their tokens on the model's (input) device."""
    return dataclasses.replace(eb, tokens=eb.tokens.to(model_device(model)))


# ------------------------------------------------------------------------------------------------------------ injection


def injection_plan(model, spec: InjectionSpec, batch_size: int) -> tuple[list[str], list[str], list[str]]:
    """(junk types, cutoffs, skipped notes): 'all' expands to every type that applies to the model (own-direction
    only for projection gates); a type asked for by name that does not apply is an error."""
    kinds = list(dict.fromkeys(JUNK_TYPES if "all" in spec.junk else spec.junk))
    skipped = []
    if "own-direction" in kinds:
        try:
            own_directions(model)
        except ValueError as e:
            if "own-direction" in spec.junk:
                raise UsageError(f"--junk own-direction: {e}") from None
            kinds.remove("own-direction")
            skipped.append(f"own-direction ({e})")
    if batch_size < 2 and "structured" in kinds:
        raise UsageError(
            "--junk structured needs --batch-size >= 2 (its junk comes from the other sequences of the batch)"
        )
    return kinds, list(dict.fromkeys(spec.cutoffs)), skipped
