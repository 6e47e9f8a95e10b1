"""Time and peak memory of ablated forwards (`probe ablate`) against stream length on real weights, beside clean ones.

    nice python benchmarks/ablate_long.py [--model gemma-3-270m] [--ctx 2048 8192] [--data kjv] [--threads 2]
                                          [--ways knockout evict evict-cache] [--keep 4] [--window 252]
                                          [--repeat 2]

Every (T, way) runs in its own subprocess, so its peak resident memory (``ru_maxrss``: the model's weights included)
is its own; the process times the way's forward and a clean one in turn, ``--repeat`` times each (fastest of each),
so that their ratio is measured under the same load. One window of T tokens of ``--data``, B = 1; a forward is the
forward with its loss (hidden states, the LM head in chunks: what ``probe ablate`` times per condition). The ways:

  knockout     key 0 out of every layer's softmax (``Ablation("knockout", "key0")``);
  evict        window eviction k=keep, w=window in every layer, keys at their positions in the text;
  evict-cache  the same at positions within the cache (docs/definitions.md#window-eviction).

Goal (docs/definitions.md#ablations): an ablated forward <= 1.1x a clean one, memory O(T).
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
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]  # benchmarks/kernels.py shadows `kernels`

WAYS = ("knockout", "evict", "evict-cache")


def child(args, ctx: int, way: str) -> dict:
    """One (T, way) measurement in this process."""
    import torch

    import probe
    from probe.analyses.ablate import Ablation, ablation_hooks
    from probe.analyses.capture import loss_forward_kwargs, output_losses
    from probe.jobs.inputs import windows_for
    from probe.jobs.specs import WindowSpec
    from probe.kernels.sink_attention import edits

    torch.set_num_threads(args.threads)
    model = probe.load(args.model)
    eb, _ = windows_for(WindowSpec(data=args.data, ctx=ctx, batches=1, batch_size=1), model)
    ids, targets = eb.tokens[0, :, :-1], eb.tokens[0, :, 1:]
    kw = loss_forward_kwargs(model)
    setting = f"k={args.keep},w={args.window}" + (",pos=cache" if way == "evict-cache" else "")
    abl = {"knockout": Ablation("knockout", "key0"), "evict": Ablation("evict", setting)}.get(way.split("-")[0])
    times, loss = {"clean": [], way: []}, {}
    with torch.no_grad():
        model(ids[:, :16], **kw)  # lazy initialisation outside the timing
        for _ in range(args.repeat):
            for name, hooks in (("clean", None), (way, abl)):
                t0 = time.perf_counter()
                with edits.armed():
                    out = model.run_with_hooks(
                        ids, fwd_hooks=[] if hooks is None else ablation_hooks(model, hooks), **kw
                    )
                loss[name] = float(output_losses(model, out, targets).mean())
                times[name].append(time.perf_counter() - t0)
    return {
        "ctx": ctx,
        "way": way,
        "seconds": min(times[way]),
        "clean_seconds": min(times["clean"]),
        "ratio": min(times[way]) / min(times["clean"]),
        "loss": loss[way],
        "delta": loss[way] - loss["clean"],
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "load": os.getloadavg()[0],
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gemma-3-270m")
    ap.add_argument("--ctx", type=int, nargs="+", default=[2048, 8192])
    ap.add_argument("--data", default="kjv")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ways", nargs="+", choices=WAYS, default=list(WAYS))
    ap.add_argument("--keep", type=int, default=4)
    ap.add_argument("--window", type=int, default=252)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--child", nargs=2, metavar=("CTX", "WAY"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args, int(args.child[0]), args.child[1])))
        return
    rows = []
    for ctx in args.ctx:
        for way in args.ways:
            cmd = [sys.executable, __file__, *(argv or sys.argv[1:]), "--child", str(ctx), way]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=os.environ).stdout
            r = json.loads(out.strip().splitlines()[-1])
            rows.append(r)
            print(
                f"{ctx:6d}  {way:12s} {r['seconds']:8.2f} s (clean {r['clean_seconds']:.2f} s, {r['ratio']:.2f}x)  "
                f"{r['peak_rss_gb']:.2f} GB  loss {r['loss']:.4f} (delta {r['delta']:+.4f})  load {r['load']:.1f}",
                flush=True,
            )
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
