"""Training throughput of every variant at a tier, as a ratio to the baseline measured in the same run.

    python benchmarks/models.py [--tier tiny] [--batch 8] [--ctx 256] [--iters 5] [--variants a b ...] [--fwd-bwd]

A step is what `probe train` does per optimizer step: forward, loss, backward, gradient clipping and the AdamW step
with the trainer's parameter groups (``--fwd-bwd``: forward and backward only, the model cost alone).
Goals (issue #2): GatedV >= 0.98, sink and gate variants >= 0.95, block low-rank AttnRes >= 0.92, MUDD >= 0.88.
Variants are timed interleaved (round-robin) so drift of the machine hits all of them alike.
"""
from __future__ import annotations

import argparse
import time

import torch

from probe.models import VARIANTS, create
from probe.train import TrainConfig, build_optimizer

DEFAULT = [v for v in VARIANTS if "{" not in v] + ["attnres-block4", "plr-block4-r32", "slr-block4-r32",
                                                   "plr-full-r32", "slr-full-r32"]


def step_time(model, ids, optimizer=None) -> float:
    """Seconds of one step: fwd+bwd, plus clipping and the optimizer step when ``optimizer`` is given."""
    t0 = time.perf_counter()
    model(ids, labels=ids).loss.backward()
    if optimizer is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tier", default="tiny")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--variants", nargs="*", default=DEFAULT)
    ap.add_argument("--fwd-bwd", action="store_true", help="time forward+backward only (no clipping, no AdamW)")
    args = ap.parse_args()
    names = ["baseline"] + [v for v in dict.fromkeys(args.variants) if v != "baseline"]
    models = {v: create(v, tier=args.tier) for v in names}
    optimizers = {v: None if args.fwd_bwd else build_optimizer(m, TrainConfig(lr=1e-4)) for v, m in models.items()}
    vocab = models["baseline"].config.vocab_size
    ids = torch.randint(0, vocab, (args.batch, args.ctx), generator=torch.Generator().manual_seed(0))
    for v, m in models.items():  # warm-up (and the optimizer's state allocation)
        step_time(m, ids, optimizers[v])
    times = {v: [] for v in names}
    for _ in range(args.iters):
        for v, m in models.items():
            times[v].append(step_time(m, ids, optimizers[v]))
    tokens = args.batch * args.ctx
    base = sorted(times["baseline"])[len(times["baseline"]) // 2]
    print(f"tier={args.tier} batch={args.batch} ctx={args.ctx} threads={torch.get_num_threads()} "
          f"(median of {args.iters} {'fwd+bwd' if args.fwd_bwd else 'training (fwd+bwd+clip+AdamW)'} steps)")
    print(f"{'variant':<22}{'tokens/s':>12}{'ratio':>8}")
    for v in names:
        med = sorted(times[v])[len(times[v]) // 2]
        print(f"{v:<22}{tokens / med:>12.0f}{base / med:>8.3f}")


if __name__ == "__main__":
    main()
