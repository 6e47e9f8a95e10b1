"""Time and peak memory of `probe sinks --massive` against context length on real weights, beside plain forwards.

    nice python benchmarks/long_context.py [--model gemma-3-270m] [--ctx 1024 2048 4096 8192 16384 32768]
                                           [--data kjv] [--threads 2] [--repeat 1]
                                           [--ways sinks sinks-plain probe-forward hf-forward]

Every (T, way) runs in its own subprocess, so its peak resident memory (``ru_maxrss`` of that process: the model's
weights included) is its own. One window of T tokens of ``--data`` (KJV is one long document: windows of 32k tokens
exist without packing), B = 1. The ways:

  sinks          ``probe.analyses.sink_pass.sink_analyses(eps=[0.3], massive=True)``: what `probe sinks --massive`
                 computes (sink statistics, Sink^eps, massive activations) from one forward, stopped after the last
                 layer's attention as the verb stops it;
  sinks-plain    the same without massive activations (`probe sinks`);
  probe-forward  the adapted model's forward to the final hidden states (``return_hidden``: no LM head), no hooks;
  hf-forward     the same weights' transformers forward with transformers' own SDPA attention and masks, to the final
                 hidden states (what a user of the plain HF model pays; its sliding layers get a dense T x T bool mask).

Goals (docs/definitions.md#long-context): peak RSS <= 4 GB at T = 32k with the 1.1 GB model, time <= 1.15x the
plain forward.

Measured 2026-12-01 under ``nice`` on this project's 2-core machine, 2 threads, load average 0.5-2.3 (1k, 2k, 4k,
16k: ``--repeat 2``, fastest of two; 8k and 32k: one run; the HF forward: one run), kjv, one window per T,
seconds / peak RSS GB:

      T   sinks --massive   sinks (plain)   probe forward    HF SDPA forward   sinks / probe fwd
   1024     1.62 / 1.37      1.41 / 1.37     1.42 / 1.36      1.39 / 1.36       1.14x / 0.99x
   2048     3.56 / 1.45      3.12 / 1.43     2.89 / 1.45      5.93 / 1.41       1.23x / 1.08x
   4096     7.70 / 1.53      6.93 / 1.52     7.21 / 1.55     11.0  / 1.57       1.07x / 0.96x
   8192    17.4  / 1.73     15.4  / 1.75    16.3  / 1.72     48.1  / 1.96       1.06x / 0.94x
  16384    42.0  / 2.14     38.2  / 2.06    39.0  / 2.08      not run           1.08x / 0.98x
  32768   106.6  / 2.71     93.6  / 2.69    94.6  / 2.69      not run           1.13x / 0.99x

Both goals are met at 32k: 2.71 GB, and 1.13x the model's own forward with massive activations (0.99x without). The
sink pass reads its masses on key 0 and on a few massive-activation positions from the forward's ``hook_lse``
(docs/definitions.md#row-log-normaliser) instead of recomputing every score, which had cost 1.48x (490 s against
331 s at 32k, load 4-8, before that change). The HF forward at 16k and 32k was not run: its sliding layers attend over
a dense T x T mask, about 4x per doubling.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# benchmarks/kernels.py would shadow the `kernels` package transformers imports: keep this folder off the path
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]

WAYS = ("sinks", "sinks-plain", "probe-forward", "hf-forward")


def child(model_name: str, data: str, ctx: int, way: str, threads: int) -> dict:
    """One (T, way) measurement in this process: seconds of the timed call and this process's peak RSS."""
    import torch

    import probe
    from probe.analyses.sink_pass import sink_analyses
    from probe.jobs.inputs import windows_for
    from probe.jobs.specs import WindowSpec

    torch.set_num_threads(threads)
    model = probe.load(model_name)
    eb, _ = windows_for(WindowSpec(data=data, ctx=ctx, batches=1, batch_size=1), model)
    ids = eb.tokens[0, :, :-1]
    if way == "hf-forward":
        model.hf_model.set_attn_implementation("sdpa")  # transformers' own attention and mask builder
    with torch.no_grad():
        model(ids[:, :16], return_hidden=True)  # lazy initialisation outside the timing
        rss_loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        t0 = time.perf_counter()
        if way in ("sinks", "sinks-plain"):
            found = sink_analyses(model, eb, eps=[0.3], massive=way == "sinks")
        elif way == "probe-forward":
            model(ids, return_hidden=True)
        else:
            model.hf_model.base_model(input_ids=ids, use_cache=False)
        seconds = time.perf_counter() - t0
    out = {
        "ctx": ctx,
        "way": way,
        "seconds": seconds,
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "rss_after_load_gb": rss_loaded,
    }
    if way.startswith("sinks"):  # the numbers themselves, to check a run read real attention
        s = found["sinks"]["summary"].iloc[0]
        out.update(pos0_share=float(s["pos0_share"]), r0=float(s["r0"]))
    return out


def run_one(args, ctx: int, way: str) -> dict:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        way,
        "--model",
        args.model,
        "--data",
        args.data,
        "--threads",
        str(args.threads),
        "--ctx",
        str(ctx),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        return {"ctx": ctx, "way": way, "error": (done.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="gemma-3-270m")
    p.add_argument("--ctx", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384, 32768])
    p.add_argument("--data", default="kjv")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--ways", nargs="+", choices=WAYS, default=list(WAYS))
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run the ways in turn this many times per T and report each way's fastest (load on a shared machine "
        "only ever adds time)",
    )
    p.add_argument("--child", choices=WAYS, help=argparse.SUPPRESS)
    p.add_argument("--json", type=Path, help="also write the rows here")
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.model, args.data, args.ctx[0], args.child, args.threads)))
        return 0
    print(
        f"{args.model}, one window of --data {args.data}, B = 1, {args.threads} threads, load average at start "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}",
        flush=True,
    )
    print(f"{'T':>6}  {'way':<14} {'seconds':>9} {'peak RSS GB':>12}  notes", flush=True)
    rows = []
    for ctx in args.ctx:
        for _ in range(args.repeat):
            for way in args.ways:
                r = run_one(args, ctx, way)
                rows.append(r)
                if "error" in r:
                    print(f"{ctx:>6}  {way:<14} failed: {r['error']}", flush=True)
                    continue
                note = f"pos0 {r['pos0_share']:.4f}, r0 {r['r0']:.3f}" if way.startswith("sinks") else ""
                print(f"{ctx:>6}  {way:<14} {r['seconds']:>9.2f} {r['peak_rss_gb']:>12.2f}  {note}", flush=True)
        done = [r for r in rows if r["ctx"] == ctx and "error" not in r]
        by_way = {r["way"]: r for r in sorted(done, key=lambda r: -r["seconds"])}  # the fastest of each way, last
        for sinks in ("sinks", "sinks-plain"):
            ratios = [
                f"{by_way[sinks]['seconds'] / by_way[w]['seconds']:.2f}x the {w}"
                for w in ("probe-forward", "hf-forward")
                if w in by_way and sinks in by_way
            ]
            if ratios:
                print(f"{ctx:>6}  {sinks} = {', '.join(ratios)}", flush=True)
    print(f"load average at end {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
