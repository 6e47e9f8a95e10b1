"""Hyper-connections' fwd+bwd throughput at a tier beside the baseline, each with its boundaries fused (the default
where no hook is attached) and through the blocks' own read and write ("unfused"), and mHC with its Sinkhorn steps
differentiated by autograd (the plain loop, as before the hand-written backward) or by probe's backward.

    python benchmarks/hyper_throughput.py [--tier tiny] [--batch 8] [--ctx 128] [--iters 5] [--no-flush-denormal]
                                          [--backend compiled]

Models are timed interleaved (round-robin, every other round in reverse order), one thread, median of ``--iters``,
in wall-clock and in CPU time; the goal is >= 0.88 of the baseline's throughput. Denormal floats are flushed to zero
for every model alike unless ``--no-flush-denormal`` (as benchmarks/attention_rules_throughput.py). ``--backend`` is
the runtime backend every model runs under (probe.kernels.backend): under the default ("auto") the connections' read,
write and Sinkhorn run as C kernels on CPU (probe.kernels.hyper_streams), under ``torch`` as torch products.
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
import probe.models.model as probe_model  # noqa: E402
from probe.kernels.backend import BACKENDS, current_backend, use_backend  # noqa: E402
from probe.kernels.denormals import set_flush_denormal  # noqa: E402
from probe.kernels.heap import keep_freed_memory  # noqa: E402
from probe.models import create  # noqa: E402

PROBE_SINKHORN = hyper_connections.sinkhorn
FUSABLE = probe_model.fusable


def autograd_sinkhorn(logits: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """The Sinkhorn steps as a plain loop (autograd records every division): the reference the backward replaces."""
    comb = torch.softmax(logits, dim=-1) + eps
    for dim in [-2] + [-1, -2] * (iters - 1):
        comb = comb / (comb.sum(dim=dim, keepdim=True) + eps)
    return comb.transpose(-1, -2)


def step_seconds(model, sinkhorn, fused: bool, ids: torch.Tensor) -> tuple[float, float]:
    """One fwd+bwd: its wall-clock and its CPU seconds (the CPU time leaves out the waits for a core on a busy machine;
    it still counts the slowdown of sharing caches and memory bandwidth)."""
    hyper_connections.sinkhorn = sinkhorn  # the mHC module looks the function up at call time
    probe_model.fusable = FUSABLE if fused else (lambda model: False)  # the blocks' path, as a hook would choose it
    t0, cpu0 = time.perf_counter(), time.thread_time()
    model(ids, labels=ids).loss.backward()
    return time.perf_counter() - t0, time.thread_time() - cpu0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tier", default="tiny")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument(
        "--flush-denormal",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="denormal floats read as zero, for every model alike (probe train --flush-denormal; default on)",
    )
    ap.add_argument("--backend", choices=BACKENDS, default=None, help="the runtime backend of every model")
    args = ap.parse_args()
    with use_backend(args.backend):
        run(args)


def run(args) -> None:
    torch.set_num_threads(1)
    set_flush_denormal(args.flush_denormal)
    keep_freed_memory()  # as probe train does on CPU (probe.kernels.heap): every model alike
    runs = {"baseline": (create("baseline", tier=args.tier), PROBE_SINKHORN, True)}
    for variant in ("hc", "hc-dynamic", "mhc"):
        runs[variant] = (create(variant, tier=args.tier), PROBE_SINKHORN, True)
        runs[f"{variant} (unfused)"] = (create(variant, tier=args.tier), PROBE_SINKHORN, False)
    runs["mhc (autograd Sinkhorn)"] = (create("mhc", tier=args.tier), autograd_sinkhorn, False)
    vocab = runs["baseline"][0].config.vocab_size
    ids = torch.randint(0, vocab, (args.batch, args.ctx), generator=torch.Generator().manual_seed(0))
    for model, sinkhorn, fused in runs.values():  # warm-up
        step_seconds(model, sinkhorn, fused, ids)
    times: dict[str, list[tuple[float, float]]] = {label: [] for label in runs}
    for round_ in range(args.iters):  # every other round backwards: no model always runs right after the same one
        for label in list(runs) if round_ % 2 == 0 else reversed(list(runs)):
            times[label].append(step_seconds(*runs[label], ids))
    wall = {label: sorted(w for w, _ in t)[len(t) // 2] for label, t in times.items()}
    cpu = {label: sorted(c for _, c in t)[len(t) // 2] for label, t in times.items()}
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())  # the machine's other work: ratios are interleaved
    flush = "denormals flushed" if args.flush_denormal else "denormals kept"
    head = f"tier={args.tier} batch={args.batch} ctx={args.ctx} fwd+bwd, 1 thread, median of {args.iters}, {flush}"
    print(f"{head}, backend {current_backend()}")
    print(f"load average (1, 5, 15 min) at the end: {load}")
    print(f"{'':<26}{'wall':>9}{'ratio':>9}{'CPU':>12}{'ratio':>9}")
    for label in runs:
        w, c = wall[label], cpu[label]
        print(f"{label:<26}{w * 1e3:>6.0f} ms{wall['baseline'] / w:>9.3f}{c * 1e3:>9.0f} ms{cpu['baseline'] / c:>9.3f}")


if __name__ == "__main__":
    main()
