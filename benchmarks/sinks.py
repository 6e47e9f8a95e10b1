"""Streaming sink statistics vs a TransformerLens-style run_with_cache of every layer's pattern (same weights, tokens).

    python benchmarks/sinks.py [--model pythia-160m-shape|tiny] [--ctx 1024] [--batch 1] [--threads 2] [--repeats 2]

Goals: streaming >= 1.5x faster and <= 0.25x the peak memory growth of the cached-pattern pass.
Each method runs in its own fresh process (so one's allocator state cannot flatter the other). Memory is the peak
growth of the process's resident set (RSS, sampled every millisecond from /proc/self/statm by a background thread)
over its RSS just before the call: tensors live outside Python's heap, so tracemalloc would not see them.
The pythia-160m shape is a GPT-NeoX config with random weights (12 layers, width 768, 12 heads, rotary on 25%, vocab
50304), hooked by probe's GPT-NeoX adapter; ``tiny`` is the custom tiny-tier baseline (context 256).
A plain forward (no hooks, SDPA, logits included) is timed too, as the floor the streaming pass should approach. The
streaming pass stops the forward once the last layer's q/k/v are read, so it skips the last MLP and the LM head; the
cached-pattern pass runs the whole model as run_with_cache does.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time

from common import PeakRSS, build  # benchmarks/common.py (scripts run with benchmarks/ on sys.path)


def worker(method: str, args, queue):
    import torch

    torch.set_num_threads(args.threads)
    from probe.analyses.sinks import sink_stats, sink_stats_reference

    model = build(args.model)
    vocab = model.probe_info.vocab_size
    toks = torch.randint(0, vocab, (1, args.batch, args.ctx + 1), generator=torch.Generator().manual_seed(1))
    fn = {
        "streaming": lambda: sink_stats(model, toks),
        "cached patterns": lambda: sink_stats_reference(model, toks),
        "plain forward": lambda: model(toks[0, :, :-1]),
    }[method]
    with torch.no_grad():
        model(toks[0, :, :16])  # warm-up of lazy initialisation
        times, growth, out = [], 0, None
        for _ in range(args.repeats):
            with PeakRSS() as mem:
                t0 = time.perf_counter()
                out = fn()
                times.append(time.perf_counter() - t0)
            growth = max(growth, mem.growth)
    summary = out["heads"][["pos0_share", "phantom_share", "r0"]].to_numpy() if method != "plain forward" else None
    queue.put((method, min(times), growth, summary))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="pythia-160m-shape", choices=["pythia-160m-shape", "tiny"])
    ap.add_argument("--ctx", type=int, default=None, help="tokens per window (default 1024; 256 for tiny)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    args.ctx = args.ctx or (256 if args.model == "tiny" else 1024)
    ctx = mp.get_context("spawn")
    results = {}
    for method in ("streaming", "cached patterns", "plain forward"):
        q = ctx.Queue()
        p = ctx.Process(target=worker, args=(method, args, q))
        p.start()
        p.join()
        if p.exitcode != 0:
            raise SystemExit(f"the {method!r} worker failed (exit code {p.exitcode})")
        name, t, mem, summary = q.get()
        results[name] = (t, mem, summary)
    print(
        f"model={args.model} ctx={args.ctx} batch={args.batch} threads={args.threads} "
        f"(best of {args.repeats}; memory = peak RSS growth during the call)"
    )
    print(f"{'method':<18}{'time (s)':>10}{'peak RSS growth (MiB)':>24}")
    for name, (t, mem, _) in results.items():
        print(f"{name:<18}{t:>10.2f}{mem / 2**20:>24.1f}")
    (ts, ms, a), (tr, mr, b) = results["streaming"][:3], results["cached patterns"][:3]
    print(f"speed-up of streaming over cached patterns: {tr / ts:.2f}x (goal >= 1.5x)")
    print(f"memory of streaming / cached patterns:      {ms / max(mr, 1):.3f} (goal <= 0.25)")
    print(f"streaming / plain forward time:             {ts / results['plain forward'][0]:.2f}x")
    print(f"max |streaming - cached| over per-head pos0/phantom/r0: {abs(a - b).max():.2e}")


if __name__ == "__main__":
    main()
