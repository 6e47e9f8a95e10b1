"""Sweep for the sink-emergence recipe: which Bigram-Backcopy settings make probe's baseline form a BOS sink
(docs/definitions.md#sink-rule) on a CPU budget.

Each grid point is an ``EmergenceConfig`` (probe.experiments.sink_emergence) that differs from ``BASE`` in the named
fields. A run trains one (variant, seed) with snapshots, then measures every snapshot on 256 fixed BB sequences.

    python scripts/sink_emergence_sweep.py train  --grid sweep --point base --variant baseline --out /work/runs/bb
    python scripts/sink_emergence_sweep.py table  --out /work/runs/bb --md docs/sink_emergence_sweep.md
    python scripts/sink_emergence_sweep.py recipe --point lr3e-3 --out /work/runs/bb --md docs/sink_emergence_sweep.md

``train`` resumes a run directory (OUT/GRID/POINT/VARIANT-sSEED); ``table`` gathers every finished run's snapshot
statistics into OUT/all_snapshots.csv and writes the markdown summary (one line per run: settings, CPU minutes and the
statistics at each of its last two snapshots); ``recipe`` lists every variant's snapshots at one grid point, checks
the sink-emergence check (docs/definitions.md#sink-emergence-check) at the last two snapshots and writes
OUT/GRID/POINT/trajectories.html.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import pandas as pd

from probe.experiments.sink_emergence import (
    VARIANTS,
    EmergenceConfig,
    cpu_seconds,
    done_when,
    snapshot_table,
    summary_table,
    train_variant,
)
from probe.runs import snapshot_steps

# the starting setting (2 layers, 1 head of 128, d 128, batch 32, AdamW lr 1e-3, wd 1e-4) at T = 256, 1200 steps
BASE = EmergenceConfig(
    seeds=(0,),
    n_layers=2,
    n_heads=1,
    d_model=128,
    d_mlp=384,
    T=256,
    batch_size=32,
    lr=1e-3,
    weight_decay=1e-4,
    steps=1200,
    snapshot_every=200,
)

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
        "b16": dict(batch_size=16, steps=2400, snapshot_every=400),  # the same tokens and CPU, twice the updates
    },
}

SETTINGS = (
    "n_layers",
    "n_heads",
    "d_model",
    "d_mlp",
    "T",
    "batch_size",
    "lr",
    "weight_decay",
    "steps",
    "warmup",
    "min_lr_ratio",
    "chain_seed",
    "vocab",
    "triggers",
)


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


def cmd_measure(args):
    """(Re)compute the snapshot statistics of every finished run under OUT (cached per run; cheap)."""
    for marker in sorted(Path(args.out).glob("*/*/*/emergence.json")):
        info = json.loads(marker.read_text())
        cfg = EmergenceConfig.from_record(info["config"])
        if json.loads((marker.parent / "train_config.json").read_text())["steps"] in snapshot_steps(marker.parent):
            snapshot_table(cfg, info["variant"], info["seed"], marker.parent)
            print("measured", marker.parent)


def _runs(out: Path):
    for marker in sorted(out.glob("*/*/*/emergence.json")):
        d = marker.parent
        if (d / "snapshot_stats.csv").exists():
            yield d, json.loads(marker.read_text())


def cmd_table(args):
    out = Path(args.out)
    frames, lines = [], []
    for d, info in _runs(out):
        cfg = EmergenceConfig.from_record(info["config"])
        t = pd.read_csv(d / "snapshot_stats.csv")
        grid, point = d.parent.parent.name, d.parent.name
        t.insert(0, "point", point)
        t.insert(0, "grid", grid)
        for k in SETTINGS:
            t[k] = getattr(cfg, k)
        t["cpu_min"] = cpu_seconds(d) / 60
        frames.append(t)
        runs = t.drop_duplicates("step").sort_values("step")
        cells = [
            f"{int(r.step)}: {r.pos0_over_uniform:.2f}× / r0 {r.r0_later:.2f} / ph {r.phantom_mean:.2f} / "
            f"{'**yes**' if r.sink_formed else 'no'}"
            for r in runs.tail(2).itertuples()
        ]
        best = runs.loc[runs["pos0_over_uniform"].idxmax()]
        last = runs.iloc[-1]
        per_layer = " ; ".join(
            f"L{int(r.layer)} {r.pos0_ratio:.2f}× r0 {r.r0:.2f}"
            for r in t[t["step"] == last.step].sort_values("layer").itertuples()
        )
        lines.append(
            f"| {grid}/{point} | {info['variant']} | {info['seed']} | "
            f"{cfg.n_heads}×{cfg.d_model // cfg.n_heads}"
            f" | {cfg.d_model} | {cfg.T} | {cfg.lr:g} | {cfg.weight_decay:g} | {cfg.steps} | "
            f"{t['cpu_min'].iloc[0]:.1f} | {last.loss_copy:.3f} / {last.loss_bigram:.3f} | "
            f"{' ; '.join(cells)} | {per_layer} | "
            f"{int(best.step)}: {best.pos0_over_uniform:.2f}× r0 {best.r0_later:.2f} |"
        )
    if not frames:
        raise SystemExit(f"no finished runs under {out}")
    pd.concat(frames, ignore_index=True).to_csv(args.csv or out / "all_snapshots.csv", index=False)
    header = (
        "| run | variant | seed | heads×width | d | T | lr | wd | steps | CPU min | final loss copy / bigram | "
        "last two snapshots: step: pos0÷uniform / r0 / phantom / sink formed | last snapshot per layer | "
        "largest pos0÷uniform |\n" + "|---" * 14 + "|"
    )
    text = header + "\n" + "\n".join(lines) + "\n"
    if args.md:
        write_section(Path(args.md), "sweep table", text)
    print(text)


def write_section(md: Path, name: str, text: str):
    """Replace the text between ``<!-- NAME: ... -->`` and ``<!-- end of NAME -->`` in a page (append if absent)."""
    begin, end = f"<!-- {name}: written by scripts/sink_emergence_sweep.py -->", f"<!-- end of {name} -->"
    page = md.read_text() if md.exists() else ""
    if begin not in page:
        page += f"\n{begin}\n{end}\n"
    head, _, rest = page.partition(begin)
    _, _, tail = rest.partition(end)
    md.write_text(f"{head}{begin}\n{text}{end}{tail}")


def cmd_recipe(args):
    """Per variant, seed and snapshot at one grid point, the Done-when check at the last two snapshots, and
    trajectories.html beside the runs."""
    from probe.experiments.sink_emergence import trajectory_figure

    root = Path(args.out) / args.grid / args.point
    frames = [
        pd.read_csv(d / "snapshot_stats.csv") for d in sorted(root.glob("*-s*")) if (d / "snapshot_stats.csv").exists()
    ]
    if not frames:
        raise SystemExit(f"no finished runs under {root}")
    t = pd.concat(frames, ignore_index=True)
    order = {v: i for i, v in enumerate(VARIANTS)}
    t = t.sort_values(["seed", "variant", "step", "layer"], key=lambda c: c.map(order) if c.name == "variant" else c)
    trajectory_figure(t).write_html(root / "trajectories.html", include_plotlyjs="cdn")
    lines = [
        "| variant | seed | step | pos0÷uniform (L≥1) | r0 (L≥1) | phantom (mean) | sink formed "
        "| L0 pos0÷uniform / r0 "
        "| L1 prev@trigger / BOS elsewhere / phantom elsewhere | sink logit L0 / L1 | loss copy / bigram |",
        "|---" * 11 + "|",
    ]
    for (v, seed, step), g in t.groupby(["variant", "seed", "step"], sort=False):
        r, l0 = g.iloc[0], g[g["layer"] == 0].iloc[0]
        l1 = g[g["layer"] == 1].iloc[0] if (g["layer"] == 1).any() else l0
        logits = " / ".join(f"{x:.2f}" for x in g.sort_values("layer")["sink_logit"]) if "sink_logit" in g else ""
        lines.append(
            f"| {v} | {seed} | {step} | {r.pos0_over_uniform:.2f} | {r.r0_later:.2f} | {r.phantom_mean:.3f} | "
            f"{'**yes**' if r.sink_formed else 'no'} | {l0.pos0_ratio:.2f} / {l0.r0:.2f} | "
            f"{l1.prev_at_trigger:.3f} / {l1.bos_elsewhere:.4f} / {l1.phantom_elsewhere:.3f} | "
            f"{logits if 'nan' not in logits else '–'} | {r.loss_copy:.4f} / {r.loss_bigram:.3f} |"
        )
    text = "\n".join(lines) + "\n\n" + done_when_text(done_when(summary_table(t))) + "\n"
    if args.md:
        write_section(Path(args.md), f"recipe {args.grid}/{args.point}", text)
    print(text)


def done_when_text(check: pd.DataFrame) -> str:
    """The sink-emergence check at each seed's last two snapshots (``sink_emergence.done_when``), one line per step."""
    out = []
    for r in check.itertuples():
        failed = [
            c
            for c in (
                "baseline_sink_formed",
                "sinklogit_phantom_over_0.1",
                "sinklogit_pos0_lower",
                "sinklogit_r0_nearer_1",
            )
            if not check.loc[r.Index, c]
        ]
        verdict = "all met" if r.all_met else "NOT met: " + ", ".join(failed)
        out.append(
            f"- seed {r.seed}, step {r.step}: {verdict} (baseline {r.baseline_pos0_over_uniform:.2f}× r0 "
            f"{r.baseline_r0:.2f}; sinklogit {r.sinklogit_pos0_over_uniform:.2f}× r0 {r.sinklogit_r0:.2f} "
            f"phantom {r.sinklogit_phantom:.3f})"
        )
    return "Done-when at the last two snapshots:\n" + ("\n".join(out) if out else "- no baseline/sinklogit pair yet")


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
    s.add_argument("--csv", default=None, help="where every snapshot's row goes (default OUT/all_snapshots.csv)")
    s.set_defaults(fn=cmd_table)
    m = sub.add_parser("measure")
    m.add_argument("--out", default="/work/runs/bb")
    m.set_defaults(fn=cmd_measure)
    r = sub.add_parser("recipe")
    r.add_argument("--grid", default="sweep")
    r.add_argument("--point", default="lr3e-3")
    r.add_argument("--out", default="/work/runs/bb")
    r.add_argument("--md", default=None)
    r.set_defaults(fn=cmd_recipe)
    args = p.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()
