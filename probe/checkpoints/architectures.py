"""The coverage table: which transformers ``model_type`` probe supports, partly supports or refuses, and why
(docs/reference/architectures.md). Standard library only, so ``probe models --architectures`` and the CLI's early
``--model`` check read it without importing torch.

``architectures.json`` is generated, never written by hand: ``python -m pytest -m slow
tests/checkpoints/test_architectures.py`` runs the parity checks of ``tests/support/parity.py`` on a tiny random
config of every causal-LM ``model_type`` of the installed transformers and writes it (and the docs page); the CI run
re-checks every entry and fails when one no longer holds. Statuses:

* ``supported``: logits equal HF eager (fp32 <= 1e-5, fp64 <= 1e-10), ``hook_pattern`` equals HF's attention
  weights, a ``hook_v`` edit equals the same edit inside HF, every hook point fires, and every analysis runs, the
  streaming ones equal to their pattern-based references;
* ``partial``: that parity holds, but the listed hook points are missing (``lacks``); analyses that need them refuse;
* ``refused``: why, in one line (not decoder-only, an attention feature probe does not implement, parity failing).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

TABLE_FILE = Path(__file__).resolve().parent / "architectures.json"
STATUSES = ("supported", "partial", "refused")


class UnsupportedArchitectureError(ValueError):
    """A model whose ``model_type`` the coverage table refuses; the message is one line."""


@lru_cache(maxsize=1)
def table() -> dict:
    """The generated table: ``{"transformers": version, "counts": {...}, "types": {model_type: record}}``."""
    if not TABLE_FILE.is_file():
        return {"transformers": None, "counts": {}, "types": {}}
    return json.loads(TABLE_FILE.read_text())


def record(model_type: str) -> dict | None:
    """The table's record of ``model_type`` (status, adapter, lacks, reason, parity figures), None if unlisted."""
    return table()["types"].get(model_type)


def check_architecture(model_type: str | None, name: str) -> None:
    """Refuse, before any weight is read, a model whose type the table refuses. A type the table does not list (a
    newer transformers, a model with its own code) goes on to the generic route, which refuses in one line what it
    cannot hook."""
    found = record(model_type) if model_type else None
    if found is not None and found["status"] == "refused":
        raise UnsupportedArchitectureError(
            f"{name}: probe does not support model_type {model_type!r} ({found['reason']}); "
            f"`probe models --architectures` lists what it supports"
        )


def rows() -> list[dict]:
    """One row per listed model_type, for ``probe models --architectures``: status, adapter, what it lacks or why
    it is refused."""
    out = []
    for model_type, r in sorted(table()["types"].items()):
        note = r.get("reason") or ", ".join(r.get("lacks") or [])
        out.append(
            {
                "model_type": model_type,
                "status": r["status"],
                "adapter": r.get("adapter", ""),
                "note": note,
            }
        )
    return out
