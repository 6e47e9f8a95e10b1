"""Model names given on the command line (``--model``, ``--models``, ``--checkpoints``): the check that needs no
torch, and the one line every verb, the report and the recipes print for a name that loads nothing.

Imports only ``probe.checkpoints.load`` (standard library and huggingface-hub), so ``probe sinks --model pythia-41m``
fails within a second instead of after the half minute that torch and transformers take to import
(``benchmarks/cli_startup.py`` measures it).
"""

from __future__ import annotations

import difflib

from probe.checkpoints.load import (
    KNOWN_CHECKPOINTS,
    ModelNotFoundError,
    RevisionError,
    check_available,
    resolve,
    zoo_names,
)
from probe.errors import UsageError

KNOWN_HINT = (
    "see `probe models`: zoo names probe/tiny-<variant> and probe/bb-<variant>, "
    "pythia-14m ... pythia-12b[-deduped][@stepN], gpt-oss-20b, gpt-oss-120b, an HF repo id, a local model directory, "
    "a `probe train` run directory[@stepN] or a .gguf file"
)


def model_error(flag: str, name: str, e: ValueError) -> UsageError:
    """The one line for a model name that loads nothing: what is wrong (a local copy passed as ``flag PATH``, not as
    Python's ``probe.load``), the closest known name when there is one, and what names are accepted."""
    local_flag = flag.split("/")[0]  # report's --models/--checkpoints: a local copy goes to --models
    text = e.on_command_line(local_flag) if isinstance(e, ModelNotFoundError) else str(e).split("\n")[0]
    if isinstance(e, RevisionError):  # the revision is what is wrong, not the model's name
        return UsageError(f"{flag} {name!r}: {text}")
    base = name.split("@")[0]
    zoo = zoo_names()  # bare and probe/ prefixed, as either is accepted
    close = difflib.get_close_matches(base, [*KNOWN_CHECKPOINTS, *zoo, *(f"probe/{n}" for n in zoo)], n=1)
    hint = f"did you mean {close[0]}? " if close and close[0] != base else ""
    return UsageError(f"{flag} {name!r}: {text}; {hint}{KNOWN_HINT}")


def check_model_name(name: str, flag: str = "--model", hub: bool = True) -> None:
    """A :class:`UsageError` for a name that cannot load (``probe.checkpoints.load.check_available``), before torch;
    without ``hub`` only what the name itself says (malformed, a missing path or zoo entry), not whether a hub model is
    cached or reachable (a report's shard or resumed run loads only some of its models)."""
    try:
        check_available(name) if hub else resolve(name)
    except ValueError as e:  # ModelNotFoundError too
        raise model_error(flag, name, e) from None


__all__ = ["KNOWN_HINT", "model_error", "check_model_name"]
