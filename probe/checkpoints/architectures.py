"""The coverage table: which transformers ``model_type`` probe supports, partly supports or refuses, and why
(docs/reference/architectures.md). Standard library only, so ``probe models --architectures`` and the CLI's early
``--model`` check read it without importing torch.

``architectures.json`` is generated, never written by hand: ``python -m pytest -m slow
tests/checkpoints/test_architectures.py`` runs the parity checks of ``tests/support/parity.py`` on a tiny random
config of every causal-LM ``model_type`` of the installed transformers and writes it (and the docs page); the CI run
re-checks every entry and fails when one no longer holds. Statuses:

* ``supported``: logits equal HF eager (fp32 <= 1e-5, fp64 <= 1e-10), ``hook_pattern`` equals HF's attention
  weights, a ``hook_v`` edit equals the same edit inside HF, every hook point fires, the hook algebra holds, every
  analysis runs, the streaming ones equal to their pattern-based references, and every model verb of the CLI runs
  on a saved folder of the type (``verbs``; CI runs them on one type per adapter family);
* ``partial``: that parity holds, but the listed hook points are missing (``lacks``), a rule of the algebra breaks
  or a verb fails (``breaks``); analyses that need what is missing refuse;
* ``refused``: why, in one line (not decoder-only, an attention feature probe does not implement, parity failing).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from probe.errors import UsageError, damaged_shipped_file

TABLE_FILE = Path(__file__).resolve().parent / "architectures.json"
STATUSES = ("supported", "partial", "refused")
OWN_TYPES = ("probe", "muddformer", "muddpythia")  # probe's own formats: not transformers' types, not in the table


class UnsupportedArchitectureError(ValueError):
    """A model whose ``model_type`` the coverage table refuses; the message is one line."""


class DamagedTableError(UsageError, ValueError):
    """The shipped coverage table cannot be read; the message is one line naming the file (exit code 2 in the CLI)."""


@lru_cache(maxsize=1)
def table() -> dict:
    """The generated table: ``{"transformers": version, "counts": {...}, "types": {model_type: record}}``. Read
    only when a function needs it (never at import), so a damaged file stops only what needs the table, with one
    :class:`DamagedTableError` line naming it; a missing one is an empty table (a checkout that never made it)."""
    if not TABLE_FILE.is_file():
        return {"transformers": None, "counts": {}, "types": {}}
    try:
        data = json.loads(TABLE_FILE.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        raise _damaged(f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}") from None
    why = _table_problem(data)
    if why:
        raise _damaged(why)
    return data


def _damaged(why: str) -> DamagedTableError:
    return DamagedTableError(damaged_shipped_file("the coverage table", TABLE_FILE, why))


def _table_problem(data) -> str | None:
    """What makes ``data`` not a coverage table, or None: an object whose ``types`` maps each model_type to a record
    with a known status (and a reason when refused) and whose ``counts`` is an object."""
    if not isinstance(data, dict):
        return f"a JSON {type(data).__name__}, not an object"
    types = data.get("types")
    if not isinstance(types, dict):
        return "no types object"
    if not isinstance(data.get("counts", {}), dict):
        return "counts is not an object"
    for model_type, r in types.items():
        if not isinstance(r, dict) or r.get("status") not in STATUSES:
            return f"model_type {model_type!r} has no status of {', '.join(STATUSES)}"
        if r["status"] == "refused" and not isinstance(r.get("reason"), str):
            return f"refused model_type {model_type!r} has no reason"
        for key in ("lacks", "breaks", "layer_types"):
            if not isinstance(r.get(key, []), list):
                return f"model_type {model_type!r} has a {key} that is not a list"
    return None


def record(model_type: str) -> dict | None:
    """The table's record of ``model_type`` (status, adapter, lacks, reason, parity figures), None if unlisted."""
    return table()["types"].get(model_type)


def check_architecture(model_type: str | None, name: str) -> None:
    """Refuse, before any weight is read, a model whose type the table refuses. A type the table does not list (a
    newer transformers, a model with its own code) goes on to the generic route, which refuses in one line what it
    cannot hook."""
    if model_type is not None and not isinstance(model_type, str):  # a list, a number: one line, not a lookup
        from probe.checkpoints.config_ranges import config_problem

        raise UnsupportedArchitectureError(f"{name}: {config_problem({'model_type': model_type})}")
    if not model_type or model_type in OWN_TYPES:  # probe's own formats do not need the table
        return
    found = record(model_type)
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
        note = r.get("reason") or ", ".join((r.get("lacks") or []) + (r.get("breaks") or []))
        out.append(
            {
                "model_type": model_type,
                "kind": r.get("kind", "decoder-only"),
                "status": r["status"],
                "adapter": r.get("adapter", ""),
                "note": note,
            }
        )
    return out


def counts(types: dict) -> dict:
    """How many decoder-only model types are supported, partial and refused, and how many listed types are not
    decoder-only at all (refused for that)."""
    out = {s: 0 for s in STATUSES}
    out["not decoder-only"] = 0
    for r in types.values():
        if r.get("kind", "decoder-only") != "decoder-only":
            out["not decoder-only"] += 1
        else:
            out[r["status"]] += 1
    return out


def markdown(data: dict) -> str:
    """The docs page (docs/reference/architectures.md) of a generated table, every row from the data."""
    types, c = data["types"], data["counts"]
    lines = [
        "# Architectures",
        "",
        "<!-- generated by `python -m pytest -m slow tests/checkpoints/test_architectures.py`; do not edit -->",
        "",
        f"Generated with transformers {data['transformers']}; the release installed beside probe may differ (a "
        "newer one can add model types this table does not list, and `probe models --architectures` names both "
        f"releases). Every causal-LM `model_type` of transformers {data['transformers']}, checked on a tiny random "
        "config built "
        "from transformers' own config class with the family's features switched on "
        "(`probe.checkpoints.tiny_configs`): **supported** means logits equal to HF eager (fp32 ≤ 1e-5, fp64 ≤ "
        "1e-10), `hook_pattern` equal to HF's attention weights, a `hook_v` edit equal to the same edit inside "
        "HF, every hook point firing, the [hook algebra](../definitions.md#hook-algebra) holding in fp64 (1e-10), a "
        "folder saved and loaded through `probe.load` in fp64 equal to HF's own load of it, every analysis "
        "running, the streaming ones equal to their pattern-based references, and every model verb of the CLI "
        "(sinks, inject, ablate, gates, sources, eval, view, report) running in process on a saved folder of the "
        "type, or refusing in one line for a mechanism the model lacks (no gate, no depth routing, no knockout of "
        "signed rows); **partial** "
        "means that parity holds but the hooks listed are missing, a rule of the algebra breaks (named, with its "
        "largest difference) or a verb fails (named); "
        "**refused** says why. "
        "`probe models --architectures` prints the same table; `probe.load` refuses a refused type in one line.",
        "",
        f"Decoder-only types: {c['supported']} supported, {c['partial']} partial, {c['refused']} refused; "
        f"{c['not decoder-only']} more causal-LM types are encoders or encoder-decoder decoders (refused).",
        "",
        "Parity columns: the largest |Δ| of the logits against HF eager in fp32 and fp64, and of `hook_pattern` "
        "against `output_attentions` (fp32).",
        "",
    ]
    for status in STATUSES:
        rows = [(mt, r) for mt, r in sorted(types.items()) if r["status"] == status]
        if status == "refused":
            rows = [(mt, r) for mt, r in rows if r.get("kind", "decoder-only") == "decoder-only"]
        lines += [f"## {status.capitalize()} ({len(rows)})", ""]
        if status == "refused":
            lines += ["| model_type | why |", "|---|---|"]
            lines += [f"| `{mt}` | {r['reason'].replace('|', '/')} |" for mt, r in rows]
        else:
            lines += [
                "| model_type | adapter | layers | logits fp32 | logits fp64 | pattern | lacks / breaks |",
                "|---|---|---|---|---|---|---|",
            ]
            for mt, r in rows:
                p = r.get("parity", {})
                lines.append(
                    f"| `{mt}` | {r.get('adapter', '')} | {', '.join(r.get('layer_types', []))} | "
                    f"{p.get('logits_fp32', '')} | {p.get('logits_fp64', '')} | "
                    f"{p.get('pattern_vs_output_attentions', '')} | "
                    f"{', '.join(r.get('lacks', []) + r.get('breaks', []))} |"
                )
        lines.append("")
    others = [(mt, r) for mt, r in sorted(types.items()) if r.get("kind", "decoder-only") != "decoder-only"]
    lines += [f"## Not decoder-only ({len(others)})", "", ", ".join(f"`{mt}` ({r['kind']})" for mt, r in others), ""]
    return "\n".join(lines)
