"""Training throughput of every variant at a tier, as a ratio to the baseline measured in the same run.

    python benchmarks/models.py [--tier tiny] [--batch 8] [--ctx 256] [--iters 5] [--variants a b ...]

Two columns per variant: forward+backward alone (the model's cost; goals: GatedV >= 0.98, sink and gate
variants >= 0.95, block low-rank AttnRes >= 0.92, MUDD >= 0.88) and a whole training step as `probe train` takes it
(one optimiser step): forward, loss, backward, gradient clipping and the AdamW step with the trainer's parameter groups.
Variants are timed interleaved (round-robin) so drift of the machine hits all of them alike.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]  # benchmarks/kernels.py shadows `kernels`

import torch  # noqa: E402

from probe.models import VARIANTS, create  # noqa: E402
from probe.train import TrainConfig, build_optimizer  # noqa: E402

DEFAULT = [v for v in VARIANTS if "{" not in v] + [
    "attnres-block4",
    "plr-block4-r32",
    "slr-block4-r32",
    "plr-full-r32",
    "slr-full-r32",
]


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
    args = ap.parse_args()
    names = ["baseline"] + [v for v in dict.fromkeys(args.variants) if v != "baseline"]
    models = {v: create(v, tier=args.tier) for v in names}
    optimizers = {v: build_optimizer(m, TrainConfig(lr=1e-4)) for v, m in models.items()}
    vocab = models["baseline"].config.vocab_size
    ids = torch.randint(0, vocab, (args.batch, args.ctx), generator=torch.Generator().manual_seed(0))
    for v, m in models.items():  # warm-up (and the optimizer's state allocation)
        step_time(m, ids, optimizers[v])
    kinds = ("fwd+bwd", "train step")
    times = {(v, k): [] for v in names for k in kinds}
    for _ in range(args.iters):
        for v, m in models.items():
            times[v, "fwd+bwd"].append(step_time(m, ids))
            times[v, "train step"].append(step_time(m, ids, optimizers[v]))
    median = {key: sorted(t)[len(t) // 2] for key, t in times.items()}
    tokens = args.batch * args.ctx
    print(
        f"tier={args.tier} batch={args.batch} ctx={args.ctx} threads={torch.get_num_threads()} "
        f"(median of {args.iters}; tokens/s and ratio to baseline)"
    )
    print(f"{'variant':<22}" + "".join(f"{k + ' tok/s':>18}{'ratio':>8}" for k in kinds))
    for v in names:
        print(
            f"{v:<22}"
            + "".join(f"{tokens / median[v, k]:>18.0f}{median['baseline', k] / median[v, k]:>8.3f}" for k in kinds)
        )


if __name__ == "__main__":
    main()
