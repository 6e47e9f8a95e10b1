"""Sweep for issue 18: which Bigram-Backcopy settings make probe's baseline form a BOS sink (SPEC §8) on a CPU budget.

Each grid point is an ``EmergenceConfig`` (probe.experiments.sink_emergence) that differs from ``BASE`` in the named
fields. A run trains one (variant, seed) with snapshots, then measures every snapshot on 256 fixed BB sequences.

    python scripts/sink_emergence_sweep.py train  --grid sweep --point base --variant baseline --out /work/runs/bb
    python scripts/sink_emergence_sweep.py table  --out /work/runs/bb --md docs/sink_emergence_sweep.md

``train`` resumes a run directory (OUT/GRID/POINT/VARIANT-sSEED); ``table`` gathers every finished run's snapshot
statistics into OUT/all_snapshots.csv and writes the markdown summary (one line per run: settings, CPU minutes and the
statistics at each of its last two snapshots).
"""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict, replace
from pathlib import Path

import pandas as pd

from probe.experiments.sink_emergence import EmergenceConfig, cpu_seconds, snapshot_table, train_variant

# the setting (2 layers, 1 head of 128, d 128, batch 32, AdamW lr 1e-3, wd 1e-4) at T = 256, 1200 steps
BASE = EmergenceConfig(seeds=(0,), n_layers=2, n_heads=1, d_model=128, d_mlp=384, T=256, batch_size=32, lr=1e-3,
                       weight_decay=1e-4, steps=1200, snapshot_every=200)

# one factor at a time from BASE (steps are covered by the snapshots every 200 steps)
GRIDS: dict[str, dict[str, dict]] = {
    "sweep": {
        "base": {},
        "lr3e-3": dict(lr=3e-3),
        "lr3e-4": dict(lr=3e-4),
        "heads2": dict(n_heads=2),
        "heads4": dict(n_heads=4),
        "d64": dict(d_model=64, d_mlp=192),
        "T128": dict(T=128, steps=2400, snapshot_every=400),  # the same tokens per run
        "wd0.1": dict(weight_decay=0.1),
    },
}

SETTINGS = ("n_layers", "n_heads", "d_model", "d_mlp", "T", "batch_size", "lr", "weight_decay", "steps", "warmup",
            "min_lr_ratio", "chain_seed", "vocab", "triggers")


def point_config(grid: str, point: str, **extra) -> EmergenceConfig:
    if grid not in GRIDS or point not in GRIDS[grid]:
        choices = {g: sorted(p) for g, p in GRIDS.items()}
        raise SystemExit(f"unknown grid point {grid}/{point}; choose one of {choices}")
    return replace(BASE, **GRIDS[grid][point], **extra)


def run_dir(out: Path, grid: str, point: str, variant: str, seed: int) -> Path:
    return out / grid / point / f"{variant.replace('+', '_')}-s{seed}"


def cmd_train(args):
    cfg = point_config(args.grid, args.point, threads=1)
    d = run_dir(Path(args.out), args.grid, args.point, args.variant, args.seed)
    last = train_variant(cfg, args.variant, args.seed, d, progress=False)
    print(json.dumps({"run": str(d), **last}))
    table = snapshot_table(cfg, args.variant, args.seed, d)
    print(table.to_string(max_cols=30))


def _runs(out: Path):
    for marker in sorted(out.glob("*/*/*/emergence.json")):
        d = marker.parent
        if (d / "snapshot_stats.csv").exists():
            yield d, json.loads(marker.read_text())


def cmd_table(args):
    out = Path(args.out)
    frames, lines = [], []
    for d, info in _runs(out):
        cfg = EmergenceConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in info["config"].items()})
        t = pd.read_csv(d / "snapshot_stats.csv")
        grid, point = d.parent.parent.name, d.parent.name
        t.insert(0, "point", point)
        t.insert(0, "grid", grid)
        for k in SETTINGS:
            t[k] = getattr(cfg, k)
        t["cpu_min"] = cpu_seconds(d) / 60
        frames.append(t)
        runs = t.drop_duplicates("step").sort_values("step")
        cells = [f"{int(r.step)}: {r.pos0_over_uniform:.2f}× / r0 {r.r0_later:.2f} / ph {r.phantom_mean:.2f} / "
                 f"{'**yes**' if r.sink_formed else 'no'}" for r in runs.tail(2).itertuples()]
        best = runs.loc[runs["pos0_over_uniform"].idxmax()]
        last = runs.iloc[-1]
        lines.append(f"| {grid}/{point} | {info['variant']} | {info['seed']} | {cfg.n_heads}×{cfg.d_model // cfg.n_heads}"
                     f" | {cfg.d_model} | {cfg.T} | {cfg.lr:g} | {cfg.weight_decay:g} | {cfg.steps} | "
                     f"{t['cpu_min'].iloc[0]:.1f} | {last.loss_copy:.3f} / {last.loss_bigram:.3f} | "
                     f"{' ; '.join(cells)} | {int(best.step)}: {best.pos0_over_uniform:.2f}× r0 {best.r0_later:.2f} |")
    if not frames:
        raise SystemExit(f"no finished runs under {out}")
    pd.concat(frames, ignore_index=True).to_csv(out / "all_snapshots.csv", index=False)
    header = ("| run | variant | seed | heads×width | d | T | lr | wd | steps | CPU min | final loss copy / bigram | "
              "last two snapshots: step: pos0÷uniform / r0 / phantom / sink formed | largest pos0÷uniform |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    text = header + "\n" + "\n".join(lines) + "\n"
    if args.md:
        Path(args.md).write_text(text)
    print(text)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--grid", default="sweep")
    t.add_argument("--point", default="base")
    t.add_argument("--variant", default="baseline")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--out", default="/work/runs/bb")
    t.set_defaults(fn=cmd_train)
    s = sub.add_parser("table")
    s.add_argument("--out", default="/work/runs/bb")
    s.add_argument("--md", default=None)
    s.set_defaults(fn=cmd_table)
    args = p.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()
