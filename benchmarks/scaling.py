"""Scaling of a sink-statistics pass and an injection battery: time and peak memory against context length and
against data-parallel ranks, beside the same pass through TransformerLens' ``TransformerBridge`` + ``run_with_cache``.

    nice python benchmarks/scaling.py [--ctx 512 1024 2048 4096] [--windows 1] [--rank-ctx 512] [--cores 2]
                                      [--cache-limit-gb 3]

Model: pythia-160m's shape (GPT-NeoX: 12 layers, width 768, 12 heads, rotary on 25%, vocab 50304) with random
weights from a config, saved once to a temporary folder; probe reads it with ``probe.load``, TransformerLens with
``TransformerBridge.boot_transformers`` (same weights, HF eager attention). Windows are random token ids, one
sequence per batch.

Each measurement runs in fresh processes: one, or one per rank (torch.distributed with gloo on this CPU machine;
probe's analyses deal whole batches to ranks, ``probe.analyses.parallel``). ``--cores`` is split between the ranks
(1 rank x 2 threads vs 2 ranks x 1 thread). Time: the pass's wall time (ranks start at a barrier and stop at one).
Peak memory: ``resource.getrusage`` max RSS of the pass (tensors live outside Python's heap, so tracemalloc misses
them), its high-water mark reset through /proc/self/clear_refs once the model is loaded, so loading's own peak does
not hide the pass's; "growth" is that peak minus the RSS when the pass starts (per rank, the larger one).

Passes (and what each compares, on the same windows):
  sinks   probe: ``sink_stats`` (streaming per-row masses, nothing T x T kept). TransformerLens: ``run_with_cache``
          of every layer's ``hook_pattern`` and ``hook_v``, then the same position-0 share and r0 from the cache.
  inject  probe: ``inject`` (gaussian junk on the q25 quiet reads at dose 0.4, exposure on). TransformerLens:
          ``run_with_cache`` (clean loss; exposure from the cached patterns), then one ``run_with_hooks`` per dose
          corrupting ``hook_v`` with probe's own draws, so both must give the same loss increase.
TransformerLens runs are skipped where the cached patterns alone (L H T^2 x 4 bytes a window) exceed --cache-limit-gb.
The last column checks agreement: the largest difference of per-layer position-0 shares (sinks) or of loss increases
(inject) between the TransformerLens run and probe's run of the same pass and context.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# benchmarks/kernels.py would shadow the `kernels` package transformers imports: keep this folder off the path
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]

import torch  # noqa: E402

DOSES = (0.4,)  # one condition: the run must fit a 15-minute budget on a shared 2-core machine


# ------------------------------------------------------------------ one measurement (a fresh process, or one rank)


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reset_peak() -> None:
    """Reset this process's max-RSS high-water mark (Linux >= 4.0): getrusage then reports the pass's own peak."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def probe_sinks(model, toks):
    from probe.analyses.sinks import sink_stats

    layers = sink_stats(model, toks)["layers"]
    return layers["pos0_share"].tolist() + layers["r0"].tolist()


def probe_inject(model, toks):
    from probe.analyses.inject import inject

    res = inject(model, toks, junk=["gaussian"], cutoffs=["q25"], doses=list(DOSES), progress=False)
    return res["results"]["delta"].tolist()


def _cached(bridge, ids):
    return bridge.run_with_cache(ids, names_filter=lambda h: h.endswith(("attn.hook_pattern", "attn.hook_v")))


def tl_sinks(bridge, toks):
    """Per layer, position-0 share (rows t >= 1) and r0 = ||v_0|| / median ||v_j||, as probe defines them, from
    run_with_cache's patterns and reads."""
    n_layers, n_windows = bridge.cfg.n_layers, toks.shape[0]
    pos0, r0 = [0.0] * n_layers, [0.0] * n_layers
    for n in range(n_windows):
        _, cache = _cached(bridge, toks[n, :, :-1])
        for l in range(n_layers):
            pat = cache[f"blocks.{l}.attn.hook_pattern"][:, :, 1:]  # B,H,T-1,T
            pos0[l] += (pat[..., 0] / pat.sum(-1)).mean().item() / n_windows
            norms = cache[f"blocks.{l}.attn.hook_v"].norm(dim=-1)  # B,T,H
            r0[l] += (norms[:, 0] / torch.quantile(norms, 0.5, dim=1)).mean().item() / n_windows
        del cache
    return pos0 + r0


def tl_inject(bridge, toks):
    """Clean loss and exposure from run_with_cache, then each dose through run_with_hooks with probe's draws."""
    import torch.nn.functional as F

    from probe.analyses.inject import JunkDraws, corrupt, quiet_mask

    def corrupt_reads(layer, dose, batch):  # probe's draws for (seed 0, batch, layer): the same junk as inject's
        return lambda v, hook: corrupt(v, dose, 0.25, JunkDraws("gaussian", v.shape, 0, batch, layer))

    n_layers = bridge.cfg.n_layers
    clean, corrupted, count = 0.0, [0.0] * len(DOSES), 0
    for n in range(toks.shape[0]):
        ids, tgt = toks[n, :, :-1], toks[n, :, 1:]
        logits, cache = _cached(bridge, ids)
        clean += float(F.cross_entropy(logits.flatten(0, 1).float(), tgt.flatten(), reduction="sum"))
        count += tgt.numel()
        for l in range(n_layers):  # exposure: each row's mass on the quiet reads (q25), rows t >= 1
            quiet = quiet_mask(cache[f"blocks.{l}.attn.hook_v"].float().norm(dim=-1), 0.25)  # B,T,H
            pat = cache[f"blocks.{l}.attn.hook_pattern"][:, :, 1:]  # B,H,T-1,T
            (pat * quiet.transpose(1, 2)[:, :, None, :]).sum(-1).mean().item()  # what probe's exposure reports
        del cache, logits
        for i, dose in enumerate(DOSES):
            hooks = [(f"blocks.{l}.attn.hook_v", corrupt_reads(l, dose, n)) for l in range(n_layers)]
            logits = bridge.run_with_hooks(ids, fwd_hooks=hooks)
            corrupted[i] += float(F.cross_entropy(logits.flatten(0, 1).float(), tgt.flatten(), reduction="sum"))
    return [(c - clean) / count for c in corrupted]


PASSES = {
    ("sinks", "probe"): probe_sinks,
    ("sinks", "tl"): tl_sinks,
    ("inject", "probe"): probe_inject,
    ("inject", "tl"): tl_inject,
}


def load(method: str, folder: str):
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    transformers.utils.logging.disable_progress_bar()
    if method == "probe":
        import probe

        return probe.load(folder, dtype=torch.float32)
    from transformer_lens.model_bridge import TransformerBridge

    hf = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32).eval()
    return TransformerBridge.boot_transformers(folder, hf_model=hf, tokenizer=AutoTokenizer.from_pretrained(folder))


def measure(job: dict) -> dict:
    """Run one pass in this process (one rank of ``WORLD_SIZE`` when set) and return its time and memory."""
    import torch.distributed as dist

    torch.set_num_threads(job["threads"])
    world = int(os.environ.get("WORLD_SIZE", 1))
    if world > 1:
        dist.init_process_group("gloo")  # env:// from RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    barrier = dist.barrier if world > 1 else (lambda: None)
    model = load(job["method"], job["folder"])
    toks = torch.randint(0, 50304, (job["windows"], 1, job["ctx"] + 1), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model(toks[0, :, :16])  # lazy initialisation outside the timed pass
        rss0 = _rss()
        _reset_peak()
        barrier()
        t0 = time.perf_counter()
        check = PASSES[job["pass"], job["method"]](model, toks)
        barrier()
        seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    if world > 1:
        dist.destroy_process_group()
    return {"seconds": seconds, "peak": peak, "growth": peak - rss0, "check": check}


# ------------------------------------------------------------------ the driver: fresh processes, tables


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(job: dict, ranks: int, cores: int) -> dict:
    """``job`` in ``ranks`` fresh processes (threads: cores / ranks); the slowest rank's time, the largest peak."""
    job = {**job, "threads": max(1, cores // ranks)}
    env = {
        **os.environ,
        "WORLD_SIZE": str(ranks),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "PYTHONWARNINGS": "ignore",
        "TOKENIZERS_PARALLELISM": "false",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--job", json.dumps(job)],
            stdout=subprocess.PIPE,
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
            text=True,
        )
        for r in range(ranks)
    ]
    outs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"measurement {job} failed (exit codes {[p.returncode for p in procs]})")
    res = [json.loads(o.strip().splitlines()[-1]) for o in outs]
    return {
        "seconds": max(r["seconds"] for r in res),
        "peak": max(r["peak"] for r in res),
        "growth": max(r["growth"] for r in res),
        "check": res[0]["check"],
    }


def save_model(folder: Path, max_ctx: int) -> None:
    """pythia-160m's shape, random weights (seed 0), and a word-level tokenizer over its vocabulary."""
    from transformers import AutoModelForCausalLM

    from probe.checkpoints.tiny import tiny_tokenizer

    sys.path.insert(0, str(HERE))  # for benchmarks/common.py, once transformers is imported
    from common import pythia_160m_config

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(pythia_160m_config(max_positions=max_ctx)).save_pretrained(folder)
    tiny_tokenizer(50304).save_pretrained(folder)


def mib(x: float) -> str:
    return f"{x / 2**20:,.0f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--ctx",
        type=int,
        nargs="*",
        default=[512, 1024, 2048, 4096],
        help="context lengths (none: only the ranks comparison)",
    )
    ap.add_argument("--windows", type=int, default=1, help="windows (batches of one sequence) per context length")
    ap.add_argument("--rank-ctx", type=int, default=512, help="context of the ranks comparison (2 windows; 0: skip)")
    ap.add_argument("--cores", type=int, default=2, help="threads in all, split between the ranks")
    ap.add_argument(
        "--cache-limit-gb",
        type=float,
        default=3.0,
        help="largest pattern cache TransformerLens may "
        "hold (default 3: T=2048 runs, 4096's 9 GiB does not, on a shared 23 GB machine)",
    )
    ap.add_argument("--passes", nargs="+", default=["sinks", "inject"], choices=["sinks", "inject"])
    ap.add_argument("--job", help=argparse.SUPPRESS)  # a measurement, in a fresh process
    ap.add_argument("--save", help=argparse.SUPPRESS)  # write the model, in a fresh process
    args = ap.parse_args()
    if args.job:
        print(json.dumps(measure(json.loads(args.job))))
        return
    if args.save:
        save_model(Path(args.save), max(args.ctx))
        return
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="probe-scaling-") as folder:
        max_ctx = max([*args.ctx, args.rank_ctx])  # the size of the model's position table
        subprocess.run([sys.executable, __file__, "--save", folder, "--ctx", str(max_ctx)], check=True)
        print(
            f"pythia-160m shape, random weights; {args.windows} window(s) of batch 1 per context; {args.cores} cores "
            f"in all; load average {os.getloadavg()[0]:.1f} at start (a shared, busy machine: times are indicative)"
        )
        if args.ctx:
            print(
                "\n| pass | T | probe s | probe peak MiB | probe growth MiB | growth / T=first | TL s | "
                "TL peak MiB | TL growth MiB | growth / T=first | TL / probe s | TL / probe growth | max diff |"
            )
            print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for name in args.passes:
            base = {}
            for ctx in args.ctx:
                job = {"pass": name, "ctx": ctx, "windows": args.windows, "folder": folder}
                p = run({**job, "method": "probe"}, 1, args.cores)
                base.setdefault("probe", p["growth"])
                row = [
                    name,
                    ctx,
                    f"{p['seconds']:.1f}",
                    mib(p["peak"]),
                    mib(p["growth"]),
                    f"{p['growth'] / base['probe']:.2f}",
                ]
                cache_bytes = 12 * 12 * ctx * ctx * 4 * args.windows
                if cache_bytes > args.cache_limit_gb * 2**30:
                    row += [f"skipped: patterns alone {cache_bytes / 2**30:.1f} GiB"] + [""] * 6
                else:
                    t = run({**job, "method": "tl"}, 1, args.cores)
                    base.setdefault("tl", t["growth"])
                    diff = max(abs(a - b) for a, b in zip(p["check"], t["check"]))
                    row += [
                        f"{t['seconds']:.1f}",
                        mib(t["peak"]),
                        mib(t["growth"]),
                        f"{t['growth'] / base['tl']:.2f}",
                        f"{t['seconds'] / p['seconds']:.2f}",
                        f"{t['growth'] / max(p['growth'], 1):.2f}",
                        f"{diff:.1e}",
                    ]
                print("| " + " | ".join(map(str, row)) + " |", flush=True)
        print("\n| pass | T | windows | ranks x threads | s | peak MiB per rank | growth MiB per rank | s / 1 rank |")
        print("|---|---:|---:|---|---:|---:|---:|---:|")
        for name in args.passes if args.rank_ctx else ():
            job = {"pass": name, "ctx": args.rank_ctx, "windows": 2, "folder": folder, "method": "probe"}
            one = None
            for ranks in (1, 2):
                r = run(job, ranks, args.cores)
                one = one or r["seconds"]
                print(
                    f"| {name} | {args.rank_ctx} | 2 | {ranks} x {max(1, args.cores // ranks)} | "
                    f"{r['seconds']:.1f} | {mib(r['peak'])} | {mib(r['growth'])} | {r['seconds'] / one:.2f} |",
                    flush=True,
                )
    print(f"\ntotal {time.perf_counter() - start:.0f} s; load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
