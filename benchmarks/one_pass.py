"""The cost of `probe sinks` at default flags as a ratio to one plain forward of the model over the same windows.

    nice python benchmarks/one_pass.py [--model gemma-3-270m] [--batches 4] [--batch-size 4] [--ctx 512]
                                       [--threads 2] [--repeats 3] [--tiny probe/tiny-sink+proj]

Goal: <= 1.15x on Gemma 3 270M (before sink statistics and Sink^eps shared one pass, the verb ran two: 2.2x).
What is timed, on the verb's own windows (``probe.jobs.inputs.windows_for``; 16 windows of 512 tokens of the default
corpus by default, BOS first as Gemma's tokenizer does), each the median of ``--repeats`` runs interleaved so that a
change of load on a shared machine hits all four alike:

  plain forward   ``model(ids)`` per batch, no hooks, logits included (what any use of the model pays);
  no LM head      the same forward to the final hidden states (``return_hidden``, as ``probe eval`` runs it): Gemma's
                  262k-token unembedding and its (B, T, 262144) fp32 logits are most of a plain forward's cost;
  one pass        ``probe.analyses.sink_pass.sink_analyses`` at the verb's defaults (eps 0.3): what `probe sinks`
                  computes, sink statistics and Sink^eps from one forward per batch;
  two passes      ``sink_stats`` then ``sink_heads``, one forward per batch each: what the verb ran before.

The ratios divide by the plain forward, and by the forward without the LM head. The analyses stop each forward after
the last layer's attention (the last MLP, the final norm and the LM head are skipped) and add the kernels' row masses
per layer. The tiny zoo model
(``--tiny``, its default windows: 8 x 8 at its training context) is measured the same way beside it.
Gemma 3 270M is ``probe.load("gemma-3-270m")`` (``probe-attn[gemma]``; the first load converts the GGUF into
~/.cache/probe/gguf, about a minute).

Measured 2026-12-01 under ``nice`` on this project's shared 2-core machine, 2 threads, load average 1.8 at the start
and 2.0 at the end (a quiet spell; an earlier run at load 6-23 gave the same order with 3-10x slower, erratic times):

  gemma-3-270m, 4 x 4 windows of 512 tokens: plain forward 27.32 s, without the LM head 10.90 s; one pass 11.96 s
      (0.44x the plain forward, 1.10x the forward without the head); two passes 23.74 s (0.87x, 2.18x)
  probe/tiny-sink+proj, 8 x 8 windows of 256 tokens: plain forward 0.68 s, without the LM head 0.36 s; one pass
      0.47 s (0.69x, 1.31x); two passes 0.95 s (1.39x, 2.64x)

The "without the LM head" ratios are the ones comparable with the 2.2x the two-pass verb was measured at.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# benchmarks/kernels.py would shadow the `kernels` package transformers imports: keep this folder off the path
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]

import torch  # noqa: E402


def plain_forward(model, eb, **kwargs) -> None:
    for n in range(eb.tokens.shape[0]):
        model(eb.tokens[n, :, :-1], **kwargs)


def measure(name: str, windows: dict, repeats: int) -> dict:
    """Median seconds of each way over ``repeats`` interleaved runs, and the ratios to the plain forward."""
    import probe
    from probe.analyses.capture import loss_forward_kwargs
    from probe.analyses.sink_heads import sink_heads
    from probe.analyses.sink_pass import sink_analyses
    from probe.analyses.sinks import sink_stats
    from probe.jobs.inputs import windows_for
    from probe.jobs.specs import WindowSpec

    model = probe.load(name)
    eb, _ = windows_for(WindowSpec(**windows), model)
    ways = {
        "plain forward": lambda: plain_forward(model, eb),
        "no LM head": lambda: plain_forward(model, eb, **loss_forward_kwargs(model)),
        "one pass": lambda: sink_analyses(model, eb, eps=[0.3]),
        "two passes": lambda: (sink_stats(model, eb), sink_heads(model, eb, eps=[0.3])),
    }
    times = {k: [] for k in ways}
    with torch.no_grad():
        model(eb.tokens[0, :1, :16])  # lazy initialisation outside the timings
        for _ in range(repeats):
            for k, fn in ways.items():
                t0 = time.perf_counter()
                fn()
                times[k].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    n, b, t = eb.tokens.shape
    return {
        "model": name,
        "windows": f"{n} x {b} windows of {t - 1} tokens",
        "median_s": med,
        "runs_s": times,
        "ratio": {k: med[k] / med["plain forward"] for k in ("one pass", "two passes")},
        "ratio_no_head": {k: med[k] / med["no LM head"] for k in ("one pass", "two passes")},
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="gemma-3-270m")
    p.add_argument("--batches", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--tiny", default="probe/tiny-sink+proj", help="the zoo model measured beside it ('' skips it)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    plans = [(args.model, {"batches": args.batches, "batch_size": args.batch_size, "ctx": args.ctx})]
    if args.tiny:
        plans.append((args.tiny, {}))  # the verb's default windows for the zoo model
    print(
        f"threads {args.threads}, median of {args.repeats} runs, load average at start "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    for name, windows in plans:
        r = measure(name, windows, args.repeats)
        m = r["median_s"]
        q, h = r["ratio"], r["ratio_no_head"]
        print(
            f"{r['model']} ({r['windows']}): plain forward {m['plain forward']:.2f} s, without the LM head "
            f"{m['no LM head']:.2f} s; one pass {m['one pass']:.2f} s ({q['one pass']:.2f}x the plain forward, "
            f"{h['one pass']:.2f}x without the head), two passes {m['two passes']:.2f} s ({q['two passes']:.2f}x, "
            f"{h['two passes']:.2f}x)"
            f"; runs {', '.join(f'{k} ' + '/'.join(f'{s:.2f}' for s in v) for k, v in r['runs_s'].items())}",
            flush=True,
        )
    print(f"load average at end {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
