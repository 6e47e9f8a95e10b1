"""The cost of the per-window analyses as a ratio to one plain forward of the model over the same windows.

    nice python benchmarks/analysis_costs.py [--model probe/tiny-baseline] [--batches 1] [--batch-size 4]
                                             [--ctx 64] [--samples 16] [--threads 1] [--repeats 3]

What is timed, on the verb's own windows (``probe.jobs.inputs.windows_for``), each the fastest of ``--repeats`` runs
interleaved (on a shared machine load only adds time, so the minimum is the steadiest figure):

  plain forward        ``model(ids)`` per batch, no hooks, no grad, logits included;
  sensitivity exact    ``probe.analyses.sensitivity`` at the last layer: one forward with grad from the embedding,
                       then d backward passes (d the model width), docs/definitions.md#sensitivity;
  sensitivity sampled  the same with ``--samples`` Gaussian directions: ``--samples`` backward passes;
  sensitivity all      exact at every layer's output: d backward passes per layer;
  entropy, kurtosis, norm-weighted   the shared-pass parts alone (``attention_entropy``, ``outlier_kurtosis``,
                       ``norm_weighted``), one forward per batch each.

The windows of a batch share every backward.

Measured 2026-12-05 under ``nice`` on this project's shared 2-core machine (load average 19 throughout; the fastest of 3
interleaved runs), 1 thread, probe/tiny-baseline (d = 128, 6 layers), 1 x 4 windows
of 64 tokens, sampled k = 16:

  plain forward 0.072 s (1x); sensitivity exact 6.47 s (90x), sampled 0.87 s (12x), exact at every layer 25.0 s (347x);
  entropy 0.21 s (2.9x), kurtosis 0.071 s (1.0x), norm-weighted 0.21 s (2.9x)

A backward to the embedding alone (no weight gradients, no LM head) costs about 0.7 of a plain forward here: exact =
128 of them, sampled = 16; every layer's output sums backwards through 1 … 6 layers (about 3.5 x the last layer's).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# benchmarks/kernels.py would shadow the `kernels` package transformers imports: keep this folder off the path
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]

import torch  # noqa: E402


def plain_forward(model, eb) -> None:
    with torch.no_grad():
        for n in range(eb.tokens.shape[0]):
            model(eb.tokens[n, :, :-1])


def ways_of(model, eb, samples: int) -> dict:
    from probe.analyses.entropy import attention_entropy
    from probe.analyses.kurtosis import outlier_kurtosis
    from probe.analyses.norm_weighted import norm_weighted
    from probe.analyses.sensitivity import SensitivityOptions, sensitivity

    return {
        "plain forward": lambda: plain_forward(model, eb),
        "sensitivity exact": lambda: sensitivity(model, eb),
        "sensitivity sampled": lambda: sensitivity(model, eb, SensitivityOptions(method="sampled", samples=samples)),
        "sensitivity all": lambda: sensitivity(model, eb, SensitivityOptions(layers="all")),
        "entropy": lambda: attention_entropy(model, eb),
        "kurtosis": lambda: outlier_kurtosis(model, eb),
        "norm-weighted": lambda: norm_weighted(model, eb),
    }


def measure(name: str, windows: dict, samples: int, repeats: int) -> dict:
    """Fastest seconds of each way over ``repeats`` interleaved runs, and the ratios to the plain forward."""
    import probe
    from probe.jobs.inputs import windows_for
    from probe.jobs.specs import WindowSpec

    model = probe.load(name)
    eb, _ = windows_for(WindowSpec(**windows), model)
    ways = ways_of(model, eb, samples)
    times: dict[str, list[float]] = {k: [] for k in ways}
    plain_forward(model, eb)  # lazy initialisation outside the timings
    for _ in range(repeats):
        for k, fn in ways.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    med = {k: min(v) for k, v in times.items()}
    n, b, t = eb.tokens.shape
    return {
        "model": name,
        "windows": f"{n} x {b} windows of {t - 1} tokens",
        "d_model": model.probe_info.d_model,
        "min_s": med,
        "ratio": {k: med[k] / med["plain forward"] for k in med},
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="probe/tiny-baseline")
    p.add_argument("--batches", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--ctx", type=int, default=64)
    p.add_argument("--samples", type=int, default=16)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(
        f"threads {args.threads}, fastest of {args.repeats} runs, load average at start "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    windows = {"batches": args.batches, "batch_size": args.batch_size, "ctx": args.ctx}
    r = measure(args.model, windows, args.samples, args.repeats)
    print(f"{r['model']} (d={r['d_model']}, {r['windows']}, sampled k={args.samples}):")
    for k, s in r["min_s"].items():
        print(f"  {k:<20} {s:8.3f} s  {r['ratio'][k]:8.1f}x the plain forward", flush=True)
    print(f"load average at end {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
