"""Time and peak memory of ablated forwards (`probe ablate`) against stream length on real weights, beside clean ones.

    nice python benchmarks/ablate_long.py [--model gemma-3-270m] [--ctx 2048 8192] [--data kjv] [--threads 2]
                                          [--ways knockout evict evict-cache] [--keep 4] [--window 252]
                                          [--repeat 2] [--memory]

Every (T, way) runs in its own subprocess, so its peak resident memory (``ru_maxrss``: the model's weights included)
is its own; the process times the way's forward and a clean one in turn, ``--repeat`` times each (fastest of each),
so that their ratio is measured under the same load. One window of T tokens of ``--data``, B = 1; a forward is the
forward with its loss (hidden states, the LM head in chunks: what ``probe ablate`` times per condition). Wall time
and the process's CPU time are both given, each the fastest of the repeats: on a machine shared with other jobs the
CPU time (``time.process_time``, all threads) is the steadier measure of the work a forward does. The ways:

  knockout     key 0 out of every layer's softmax (``Ablation(Knockout())``);
  evict        window eviction k=keep, w=window in every layer, keys at their positions in the text;
  evict-cache  the same at positions within the cache (docs/definitions.md#window-eviction).

``--memory``: one more ablated forward (without its loss) under torch.profiler(profile_memory=True): its peak tensor
memory (the allocator's live bytes above the start; RSS also counts the allocator's cached pages) and its largest
single allocation, in the whole forward and within the layers' attention (hook_v_out .. hook_z), with the op that made
it, in elements (bytes over the smallest element size among that op's tensors; the model's dtype where the profiler
records none, a tensor list: marked "dtype assumed"), against T^2/4 elements.

``--ctx`` may exceed the model's maximum context: a rotary model (probe's tiny zoo models, trained at 256) runs on
past it; one whose positions stop fails in its forward.

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
ITEMSIZE = {"bool": 1, "signed char": 1, "unsigned char": 1, "c10::Half": 2, "c10::BFloat16": 2, "short int": 2}
ITEMSIZE |= {"float": 4, "int": 4, "double": 8, "long int": 8}


def largest_allocations(events, within: list[tuple[int, int]], itemsize: int) -> dict:
    """The largest single allocation among torch.profiler's kineto ``events`` (profile_memory=True), overall and
    inside the ``within`` (start_ns, end_ns) ranges: bytes, elements and the ops around it (``itemsize``: the bytes
    per element where none of those ops records a tensor dtype)."""
    ops = [e for e in events if e.name().startswith("aten::")]
    allocs = sorted((e for e in events if e.name() == "[memory]" and e.nbytes() > 0), key=lambda e: -e.nbytes())

    def described(a) -> dict:
        around = [o for o in ops if o.start_ns() <= a.start_ns() <= o.end_ns()]
        inner = max(around, key=lambda o: o.start_ns(), default=None)
        sizes = [ITEMSIZE[d] for o in around for d in o.dtypes() if d in ITEMSIZE]  # tensor dtypes: fewest bytes
        outer = min(around, key=lambda o: o.start_ns(), default=None)
        where = "?" if inner is None else f"{outer.name()} {[s for s in outer.shapes() if s]} / {inner.name()}"
        where += "" if sizes else " (dtype assumed)"
        return {"bytes": a.nbytes(), "elements": a.nbytes() // min(sizes or [itemsize]), "op": where}

    inside = next((a for a in allocs if any(lo <= a.start_ns() <= hi for lo, hi in within)), None)
    live, peak = 0, 0  # tensor bytes allocated and not yet freed since the trace began (frees come as negative bytes)
    for e in sorted((e for e in events if e.name() == "[memory]"), key=lambda e: e.start_ns()):
        live += e.nbytes()
        peak = max(peak, live)
    return {"all": described(allocs[0]) if allocs else None, "attention": inside and described(inside), "peak": peak}


def memory_trace(model, ids, hooks, kw) -> dict:
    """One forward (no loss) with ``hooks`` under torch.profiler(profile_memory=True): its largest allocations."""
    from torch.profiler import ProfilerActivity, profile, record_function

    from probe.kernels.sink_attention import edits

    ranges = []  # record_function scopes opened at hook_v_out, closed at hook_z

    def opened(x, hook):
        ranges.append(record_function(f"attention {hook.name}"))
        ranges[-1].__enter__()

    def closed(x, hook):
        ranges[-1].__exit__(None, None, None)

    marks = [(lambda n: n.endswith("attn.hook_v_out"), opened), (lambda n: n.endswith("attn.hook_z"), closed)]
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True) as prof:
        with edits.carried(model):
            model.run_with_hooks(ids, fwd_hooks=marks + hooks, **kw)
    events = prof.profiler.kineto_results.events()
    within = [(e.start_ns(), e.end_ns()) for e in events if e.name().startswith("attention ")]
    itemsize = next(model.parameters()).element_size()
    return largest_allocations(events, within, itemsize)


def child(args, ctx: int, way: str) -> dict:
    """One (T, way) measurement in this process."""
    import torch

    import probe
    from probe.analyses.ablate import Ablation, Eviction, Knockout, ablation_hooks
    from probe.analyses.capture import loss_forward_kwargs, output_losses
    from probe.jobs.inputs import windows_for
    from probe.jobs.specs import WindowSpec
    from probe.kernels.sink_attention import edits

    torch.set_num_threads(args.threads)
    model = probe.load(args.model)
    eb, _ = windows_for(WindowSpec(data=args.data, ctx=ctx, batches=1, batch_size=1, past_context=True), model)
    ids, targets = eb.tokens[0, :, :-1], eb.tokens[0, :, 1:]
    kw = loss_forward_kwargs(model)
    eviction = Eviction(keep=args.keep, window=args.window, positions="cache" if way == "evict-cache" else "original")
    abl = {"knockout": Ablation(Knockout()), "evict": Ablation(eviction)}.get(way.split("-")[0])
    times, cpu, loss = {"clean": [], way: []}, {"clean": [], way: []}, {}
    with torch.no_grad():
        model(ids[:, :16], **kw)  # lazy initialisation outside the timing
        for _ in range(args.repeat):
            for name, hooks in (("clean", None), (way, abl)):
                t0, c0 = time.perf_counter(), time.process_time()
                with edits.carried(model):
                    out = model.run_with_hooks(
                        ids, fwd_hooks=[] if hooks is None else ablation_hooks(model, hooks), **kw
                    )
                loss[name] = float(output_losses(model, out, targets).mean())
                times[name].append(time.perf_counter() - t0)
                cpu[name].append(time.process_time() - c0)
        memory = memory_trace(model, ids, ablation_hooks(model, abl), kw) if args.memory else None
    return {
        "ctx": ctx,
        "way": way,
        "seconds": min(times[way]),
        "clean_seconds": min(times["clean"]),
        "ratio": min(times[way]) / min(times["clean"]),
        "cpu_seconds": min(cpu[way]),
        "clean_cpu_seconds": min(cpu["clean"]),
        "cpu_ratio": min(cpu[way]) / min(cpu["clean"]),
        "largest_alloc": memory,
        "quarter_t2": ctx * ctx // 4,
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
    ap.add_argument("--memory", action="store_true", help="also the largest allocation (torch.profiler)")
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
                f"cpu {r['cpu_seconds']:.2f} s (clean {r['clean_cpu_seconds']:.2f} s, {r['cpu_ratio']:.2f}x)  "
                f"{r['peak_rss_gb']:.2f} GB  loss {r['loss']:.4f} (delta {r['delta']:+.4f})  load {r['load']:.1f}",
                flush=True,
            )
            memory = dict(r["largest_alloc"] or {})
            if "peak" in memory:
                peak = memory.pop("peak") / 2**20
                print(f"        peak tensor memory of the ablated forward: {peak:.0f} MiB", flush=True)
            for part, big in memory.items():
                if big is not None:
                    verdict = "below" if big["elements"] < r["quarter_t2"] else "NOT below"
                    print(
                        f"        largest allocation ({part}): {big['bytes'] / 2**20:.1f} MiB, {big['elements']:,} "
                        f"elements ({verdict} T^2/4 = {r['quarter_t2']:,}) in {big['op']}",
                        flush=True,
                    )
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
