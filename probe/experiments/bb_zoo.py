"""Ship a finished sink-emergence run as the zoo model ``probe/bb-<variant>`` (a model with a sink in the zoo).

    python -m probe.experiments.bb_zoo RUN_DIR [RUN_DIR ...] [--trained-by "the command that ran"]

RUN_DIR is one (variant, seed) of ``probe experiment sink-emergence`` (``OUT/runs/<variant>-s<seed>``) or of the
sweep (``scripts/sink_emergence_sweep.py train``): its last snapshot is the model. Like the text zoo
(``probe.train.zoo``) the entry holds the fp16 weights, the config and ``zoo.json``: the command that trains the run
(``probe experiment sink-emergence ... --variants V``; the recipe's defaults are the run's settings), the recipe, the
run's identity (``"run"``: the Bigram-Backcopy chain, BOS — what ``probe sinks --model probe/bb-V`` defaults to), the
evaluation windows and the statistics measured on the shipped weights in fp32 (pos0 ÷ uniform, r0, phantom share per
layer and the sink-rule verdict, docs/definitions.md#sink-rule), so a test can reload it anywhere and reproduce them. No
tokenizer: tokens are ids.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from dataclasses import asdict, fields
from pathlib import Path

import torch

from probe.analyses.sinks import sink_stats
from probe.experiments.sink_emergence import EmergenceConfig, build, copy_losses, run_identity
from probe.runs import METRICS, ZOO_DIR, ZOO_RECORD, metrics_records, snapshot_steps
from probe.train.checkpoint import load_model
from probe.writes import atomic_write, staging_dir

LAYER_STATS = ("pos0_share", "uniform_ref", "r0", "phantom_share")
SUMMARY_STATS = ("pos0_over_uniform", "r0_later", "phantom_share", "sink_formed")


def recipe_command(cfg: EmergenceConfig, variant: str) -> str:
    """``probe experiment sink-emergence`` with the options where ``cfg`` differs from the recipe's defaults."""
    default = EmergenceConfig()
    opts = [
        f"--{f.name.replace('_', '-')} {getattr(cfg, f.name)}"
        for f in fields(cfg)
        if f.name not in ("variants", "seeds") and getattr(cfg, f.name) != getattr(default, f.name)
    ]
    return " ".join(["probe experiment sink-emergence --out runs/sink-emergence --variants", variant, *opts])


@torch.no_grad()
def measure(model, cfg: EmergenceConfig, *, losses: bool = True) -> dict:
    """The statistics a zoo entry records: per layer and overall, on the recipe's evaluation windows (and the copy /
    bigram losses: one more forward pass, skipped with ``losses=False``)."""
    windows = cfg.task.eval_windows(cfg.n_eval_batches, cfg.eval_batch_size)
    s = sink_stats(model, windows)
    summary = s["summary"].iloc[0]
    return {
        "summary": {k: (bool(summary[k]) if k == "sink_formed" else float(summary[k])) for k in SUMMARY_STATS},
        "layers": [
            {
                "layer": int(r["layer"]),
                **{k: float(r[k]) for k in LAYER_STATS},
                "pos0_over_uniform": float(r["pos0_share"] / r["uniform_ref"]),
            }
            for _, r in s["layers"].iterrows()
        ],
        **(copy_losses(model, windows) if losses else {}),
    }


def ship(run_dir, *, trained_by: str | None = None, zoo_dir: Path = ZOO_DIR) -> dict:
    """Copy the last snapshot of a finished run into ``zoo_dir/bb-<variant>`` (atomically) with its record."""
    from transformers import AutoModelForCausalLM

    run_dir = Path(run_dir)
    info = json.loads((run_dir / "emergence.json").read_text())
    cfg = EmergenceConfig.from_record(info["config"])
    variant, seed = info["variant"], info["seed"]
    steps = snapshot_steps(run_dir)
    if cfg.steps not in steps:
        raise ValueError(f"{run_dir} is not finished: snapshots {sorted(steps)}, the run trains {cfg.steps} steps")
    model = build(cfg, variant, seed)
    load_model(model, steps[cfg.steps])
    name = f"bb-{variant}"
    tmp, final = staging_dir(zoo_dir, name), zoo_dir / name  # a new folder of a random name: never a planted one
    model.cpu().half().save_pretrained(tmp)  # shipped in fp16 like the text zoo; analyses run it in fp32
    shipped = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32).eval()
    last = [r for r in metrics_records(run_dir) if r.get("step") == cfg.steps] if (run_dir / METRICS).exists() else []
    record = {
        "name": f"probe/{name}",
        "variant": variant,
        "seed": seed,
        "command": recipe_command(cfg, variant),
        "trained_by": trained_by,
        "recipe": asdict(cfg),
        "run": run_identity(cfg, variant, seed),
        "train_metrics": last[-1] if last else None,
        "step": cfg.steps,
        "eval": {
            "windows": cfg.task.spec(),
            "n_batches": cfg.n_eval_batches,
            "batch_size": cfg.eval_batch_size,
            "seed": 0,
        },
        "stats": measure(shipped, cfg),
    }
    atomic_write(tmp / ZOO_RECORD, json.dumps(record, indent=1))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return record


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path, help="finished sink-emergence run directories")
    ap.add_argument("--trained-by", help="the command that actually trained the run (recorded beside the recipe's)")
    ap.add_argument("--zoo-dir", type=Path, default=ZOO_DIR)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    for run_dir in args.runs:
        try:
            rec = ship(
                run_dir,
                trained_by=args.trained_by and args.trained_by.replace("{run}", str(run_dir)),
                zoo_dir=args.zoo_dir,
            )
        except (ValueError, FileNotFoundError) as e:
            ap.error(str(e))
        s = rec["stats"]["summary"]
        print(
            f"{rec['name']}: pos0/uniform {s['pos0_over_uniform']:.2f}, r0 {s['r0_later']:.2f}, phantom "
            f"{s['phantom_share']:.3f}, sink_formed {s['sink_formed']}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
