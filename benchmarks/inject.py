"""The injection battery vs the same number of plain evaluation forward passes, same model and windows.

    python benchmarks/inject.py [--model tiny|pythia-160m-shape] [--batches 2] [--batch 4] [--ctx 256]
                                [--junk structured] [--doses 0.2 0.4 0.8 1.6] [--threads 2] [--repeats 2]

Goal: battery time <= 1.15x the plain passes. The battery runs one clean pass per batch (with exposure:
q25 quiet mass and phantom mass per row) and the corrupted conditions stacked along the batch dimension; the
reference is n_batches x (1 + n_conditions) plain forwards of one batch, each followed by the same next-token
cross-entropy the battery computes. Both are timed interleaved, best of ``--repeats``, in wall time and in process CPU
time (the steadier number on a shared machine; with one thread it is the work done). The ratio is given both from
the two best times and as the median over repeats of each repeat's back-to-back ratio (the steadier one here).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from common import build  # benchmarks/common.py (scripts run with benchmarks/ on sys.path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", choices=["tiny", "pythia-160m-shape"])
    ap.add_argument("--batches", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=None, help="default 256 (tiny) or 1024")
    ap.add_argument("--junk", nargs="*", default=["structured"])
    ap.add_argument("--cutoffs", nargs="*", default=["q25"])
    ap.add_argument("--doses", nargs="*", type=float, default=[0.2, 0.4, 0.8, 1.6])
    ap.add_argument("--no-exposure", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from probe.analyses.inject import conditions, inject

    ctx = args.ctx or (256 if args.model == "tiny" else 1024)
    model = build(args.model)
    V = model.probe_info.vocab_size
    toks = torch.randint(0, V, (args.batches, args.batch, ctx + 1), generator=torch.Generator().manual_seed(0))
    n_cond = len([c for c in conditions(args.junk, args.cutoffs, args.doses) if c[2] != 0])
    n_passes = args.batches * (1 + n_cond)

    def battery():
        return inject(
            model,
            toks,
            junk=args.junk,
            cutoffs=args.cutoffs,
            doses=args.doses,
            exposure=not args.no_exposure,
            progress=False,
        )

    @torch.no_grad()
    def plain():
        for n in range(args.batches):
            for _ in range(1 + n_cond):
                logits = model(toks[n, :, :-1]).logits
                F.cross_entropy(logits.float().flatten(0, 1), toks[n, :, 1:].flatten())

    with torch.no_grad():
        model(toks[0, :, :16])  # warm-up
    wall = {"battery": [], "plain": []}
    cpu = {"battery": [], "plain": []}
    for _ in range(args.repeats):  # interleaved, so drift in the machine's load hits both alike
        for name, fn in (("battery", battery), ("plain", plain)):
            w0, c0 = time.perf_counter(), time.process_time()
            out = fn()
            wall[name].append(time.perf_counter() - w0)
            cpu[name].append(time.process_time() - c0)
            if name == "battery":
                res = out
    print(
        f"model={model.probe_info.name} windows={args.batches}x{args.batch} ctx={ctx} threads={args.threads} "
        f"conditions={n_cond} exposure={not args.no_exposure} ({args.repeats} repeats)"
    )
    for kind, t in (("wall", wall), ("process CPU", cpu)):
        tb, tp = min(t["battery"]), min(t["plain"])
        # each repeat times both back to back: the median of those ratios shrugs off the machine's slow spells
        ratios = sorted(b / p for b, p in zip(t["battery"], t["plain"]))
        print(
            f"{kind:>12}: battery {tb:.2f} s    {n_passes} plain passes {tp:.2f} s    "
            f"ratio of bests {tb / tp:.3f}    "
            f"median ratio {ratios[len(ratios) // 2]:.3f} [{ratios[0]:.3f}-{ratios[-1]:.3f}] (goal <= 1.15)"
        )
    print(res["results"][["junk", "cutoff", "dose", "delta"]].to_string(index=False))


if __name__ == "__main__":
    main()
