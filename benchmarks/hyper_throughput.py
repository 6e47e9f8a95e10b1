"""Hyper-connections' fwd+bwd throughput at a tier beside the baseline, and mHC with its Sinkhorn steps
differentiated by autograd (the plain loop, as before the hand-written backward) or by probe's backward.

    python benchmarks/hyper_throughput.py [--tier tiny] [--batch 8] [--ctx 128] [--iters 5]

Models are timed interleaved (round-robin), one thread, median of ``--iters``; the goal is >= 0.88 of the baseline.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]  # benchmarks/kernels.py shadows `kernels`

import torch  # noqa: E402

import probe.models.depth_mechanisms.hyper_connections as hyper_connections  # noqa: E402
from probe.models import create  # noqa: E402

PROBE_SINKHORN = hyper_connections.sinkhorn


def autograd_sinkhorn(logits: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """The Sinkhorn steps as a plain loop (autograd records every division): the reference the backward replaces."""
    comb = torch.softmax(logits, dim=-1) + eps
    for dim in [-2] + [-1, -2] * (iters - 1):
        comb = comb / (comb.sum(dim=dim, keepdim=True) + eps)
    return comb.transpose(-1, -2)


def step_seconds(model, ids: torch.Tensor, sinkhorn) -> float:
    hyper_connections.sinkhorn = sinkhorn  # the mHC module looks the function up at call time
    t0 = time.perf_counter()
    model(ids, labels=ids).loss.backward()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tier", default="tiny")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--iters", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    runs = {v: (create(v, tier=args.tier), PROBE_SINKHORN) for v in ("baseline", "hc", "hc-dynamic")}
    runs["mhc (autograd Sinkhorn)"] = (create("mhc", tier=args.tier), autograd_sinkhorn)
    runs["mhc"] = (create("mhc", tier=args.tier), PROBE_SINKHORN)
    vocab = runs["baseline"][0].config.vocab_size
    ids = torch.randint(0, vocab, (args.batch, args.ctx), generator=torch.Generator().manual_seed(0))
    for model, sinkhorn in runs.values():  # warm-up
        step_seconds(model, ids, sinkhorn)
    times: dict[str, list[float]] = {label: [] for label in runs}
    for _ in range(args.iters):
        for label, (model, sinkhorn) in runs.items():
            times[label].append(step_seconds(model, ids, sinkhorn))
    median = {label: sorted(t)[len(t) // 2] for label, t in times.items()}
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())  # the machine's other work: ratios are interleaved
    print(f"tier={args.tier} batch={args.batch} ctx={args.ctx} fwd+bwd, 1 thread, median of {args.iters}")
    print(f"load average (1, 5, 15 min) at the end: {load}")
    for label, seconds in median.items():
        print(f"{label:<26}{seconds * 1e3:>9.0f} ms{median['baseline'] / seconds:>8.3f}")


if __name__ == "__main__":
    main()
