"""Hyper-connections' fwd+bwd throughput at a tier beside the baseline, each with its boundaries fused (the default
where no hook is attached) and through the blocks' own read and write ("unfused"), and mHC with its Sinkhorn steps
differentiated by autograd (the plain loop, as before the hand-written backward) or by probe's backward.

    python benchmarks/hyper_throughput.py [--tier tiny] [--batch 8] [--ctx 128] [--iters 5] [--no-flush-denormal]
                                          [--backend compiled] [--floor]

``--floor`` adds each variant once more with its fused boundaries' C passes replaced by the least any kernel of
this design must do: the same tensors read and written once each way as plain copies and sums, no arithmetic (the
numbers are wrong; the time is the floor of the streams' memory traffic), the weights' own small graph, Sinkhorn
and the projection's weight gradient as they are. A variant whose floor is below the goal cannot reach it through
faster stream kernels on this machine.

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

import probe.kernels.hyper_streams as hyper_streams  # noqa: E402
import probe.models.depth_mechanisms.hyper_connections as hyper_connections  # noqa: E402
import probe.models.model as probe_model  # noqa: E402
from probe.kernels.backend import BACKENDS, current_backend, use_backend  # noqa: E402
from probe.kernels.denormals import set_flush_denormal  # noqa: E402
from probe.kernels.heap import keep_freed_memory  # noqa: E402
from probe.models import create  # noqa: E402

PROBE_SINKHORN = hyper_connections.sinkhorn
FUSABLE = probe_model.fusable
KERNELS = (hyper_streams.boundary_forward, hyper_streams.boundary_backward)


def floor_forward(streams, out, post, res, proj, groups, eps, pre=None, rule=None):
    """A boundary's forward reduced to its memory traffic: X and f read once, Y and the read written once (as
    copies); the projections, rms and read weights left as zeros (their arithmetic is the kernel's, not memory)."""
    new, read = streams.clone(), out.clone()
    k = proj.shape[0] if proj is not None else 0
    dots = streams.new_zeros(*streams.shape[:2], groups, k) if k else None
    inv_rms = streams.new_ones(*streams.shape[:2], groups) if k else None
    slope = post.new_zeros(post.shape) if rule is not None else None
    return new, dots, inv_rms, read, pre if pre is not None else post.new_zeros(post.shape), slope


def floor_backward(grad, grad_read, pre, new, streams, out, post, res, projected=None, slope=None, step=1):
    """Its backward reduced the same way: G, the read's gradient, X, f (and Y where a projection reads it) read
    once, the streams' and the output's gradients written once; the small gradients zeros."""
    grad_streams = grad.clone() if grad is not None else torch.zeros_like(streams)
    grad_out = grad_read.clone()
    for read in (streams, out, new) if projected is not None else (streams, out):  # the reads the kernel does
        read.sum()
    dots = projected[1] if projected is not None else None
    small = [torch.zeros_like(t) for t in (post, res, pre)]
    return (grad_streams, grad_out, *small, torch.zeros_like(dots) if dots is not None else None)


def autograd_sinkhorn(logits: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """The Sinkhorn steps as a plain loop (autograd records every division): the reference the backward replaces."""
    comb = torch.softmax(logits, dim=-1) + eps
    for dim in [-2] + [-1, -2] * (iters - 1):
        comb = comb / (comb.sum(dim=dim, keepdim=True) + eps)
    return comb.transpose(-1, -2)


def step_seconds(model, sinkhorn, fused: bool, floor: bool, ids: torch.Tensor) -> tuple[float, float]:
    """One fwd+bwd: its wall-clock and its CPU seconds (the CPU time leaves out the waits for a core on a busy machine;
    it still counts the slowdown of sharing caches and memory bandwidth). ``floor``: the boundaries' C passes
    replaced by their memory traffic alone (floor_forward, floor_backward)."""
    hyper_connections.sinkhorn = sinkhorn  # the mHC module looks the function up at call time
    kernels = (floor_forward, floor_backward) if floor else KERNELS
    hyper_streams.boundary_forward, hyper_streams.boundary_backward = kernels  # looked up at call time too
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
    ap.add_argument("--floor", action="store_true", help="also each variant with its stream passes at their floor")
    args = ap.parse_args()
    with use_backend(args.backend):
        run(args)


def run(args) -> None:
    torch.set_num_threads(1)
    set_flush_denormal(args.flush_denormal)
    keep_freed_memory()  # as probe train does on CPU (probe.kernels.heap): every model alike
    runs = {"baseline": (create("baseline", tier=args.tier), PROBE_SINKHORN, True, False)}
    for variant in ("hc", "hc-dynamic", "mhc"):
        runs[variant] = (create(variant, tier=args.tier), PROBE_SINKHORN, True, False)
        runs[f"{variant} (unfused)"] = (create(variant, tier=args.tier), PROBE_SINKHORN, False, False)
    runs["mhc (autograd Sinkhorn)"] = (create("mhc", tier=args.tier), autograd_sinkhorn, False, False)
    for variant in ("hc", "hc-dynamic", "mhc") if args.floor else ():
        runs[f"{variant} (memory floor)"] = (create(variant, tier=args.tier), PROBE_SINKHORN, True, True)
    vocab = runs["baseline"][0].config.vocab_size
    ids = torch.randint(0, vocab, (args.batch, args.ctx), generator=torch.Generator().manual_seed(0))
    for run_ in runs.values():  # warm-up
        step_seconds(*run_, ids)
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
