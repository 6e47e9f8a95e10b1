"""Kernel benchmarks: each op's paths side by side, fwd+bwd, with ratios to a baseline.

    python benchmarks/kernels.py                 # CPU: reference / sdpa / flash paths vs naive eager (fp32)
    python benchmarks/kernels.py --T 2048        # CUDA: Triton vs reference vs torch SDPA (bf16), T=2048, dh=64
    TRITON_INTERPRET=1 python benchmarks/kernels.py --interpret   # CPU: Triton interpreter at tiny shapes

A ratio is baseline time / path time (> 1: the path is faster). Timing claims live here, never in unit tests.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from probe.kernels import attention_row_masses, depth_attention, sink_attention  # noqa: E402


def timeit(fn, repeat: int) -> float:
    """Median seconds of fn() over `repeat` runs after one warm-up."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    fn()
    sync()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def fwd_bwd(f, inputs):
    def run():
        out = f()
        out = out[0] if isinstance(out, tuple) else out
        torch.autograd.grad(out.float().square().sum(), inputs)

    return run


def report(title, rows, baseline):
    base = dict(rows)[baseline]
    print(f"\n{title}")
    for name, t in rows:
        print(f"  {name:<28} {t * 1e3:9.2f} ms   x{base / t:6.2f} vs {baseline}")


# ---------------------------------------------------------------- naive eager baselines


def naive_sink_attention(q, k, v, sink):
    """What one writes by hand: repeat kv heads, masked scores, phantom column, softmax, drop the phantom."""
    B, T, H, dh = q.shape
    G = H // k.shape[2]
    k, v = k.repeat_interleave(G, 2), v.repeat_interleave(G, 2)
    s = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(dh)
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    s = torch.cat([sink.view(1, H, 1, 1).expand(B, H, T, 1).to(s.dtype), s], -1)
    a = torch.softmax(s.float(), -1)[..., 1:].to(v.dtype)
    return torch.einsum("bhij,bjhd->bihd", a, v)


def naive_depth(values, keys, query, eps=1e-6):
    V, K = torch.stack(values), torch.stack(keys).float()  # (S, B, T, d), (S, B, T, r)
    K = K * torch.rsqrt(K.pow(2).mean(-1, keepdim=True) + eps)
    a = torch.softmax(torch.einsum("sbtr,r->sbt", K, query.float()), 0)
    return torch.einsum("sbt,sbtd->btd", a, V.float()).to(V.dtype)


def naive_row_masses(q, k, ind, sink):
    B, T, H, dh = q.shape
    G = H // k.shape[2]
    k, ind = k.repeat_interleave(G, 2), ind.repeat_interleave(G, 2)
    s = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(dh)
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logaddexp(s.logsumexp(-1), sink.view(1, H, 1))
    return lse, torch.einsum("bhij,bjhm->bhim", torch.exp(s - lse[..., None]), ind)


# ---------------------------------------------------------------- benchmarks


def bench_sink(B, T, H, Hkv, dh, dtype, device, repeat, backends):
    q, k, v = (torch.randn(B, T, h, dh, device=device, dtype=dtype, requires_grad=True) for h in (H, Hkv, Hkv))
    sink = torch.zeros(H, device=device, requires_grad=True)
    ins = [q, k, v, sink]
    rows = [("naive eager", timeit(fwd_bwd(lambda: naive_sink_attention(q, k, v, sink), ins), repeat))]
    if device == "cuda":
        qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
        rows.append(
            (
                "torch SDPA, no sink",
                timeit(
                    fwd_bwd(
                        lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=True),
                        [qt, kt, vt],
                    ),
                    repeat,
                ),
            )
        )
    for backend in backends:
        rows.append(
            (
                f"sink_attention[{backend}]",
                timeit(
                    fwd_bwd(lambda backend=backend: sink_attention(q, k, v, sink=sink, backend=backend).out, ins),
                    repeat,
                ),
            )
        )
    report(f"sink attention fwd+bwd  B={B} T={T} H={H} Hkv={Hkv} dh={dh} {dtype}", rows, rows[0][0])


def bench_depth(S, B, T, d, r, dtype, device, repeat, backends):
    values = [torch.randn(B, T, d, device=device, dtype=dtype, requires_grad=True) for _ in range(S)]
    keys = [x[..., -r:] for x in values]  # S-LR: keys are views
    query = torch.randn(r, device=device, requires_grad=True)
    ins = values + [query]
    rows = [("naive eager (stack)", timeit(fwd_bwd(lambda: naive_depth(values, keys, query), ins), repeat))]
    for backend in backends:
        rows.append(
            (
                f"depth_attention[{backend}]",
                timeit(
                    fwd_bwd(lambda backend=backend: depth_attention(values, keys, query, backend=backend).h, ins),
                    repeat,
                ),
            )
        )
    report(f"depth attention fwd+bwd  S={S} B={B} T={T} d={d} r={r} {dtype}", rows, rows[0][0])


def bench_masses(B, T, H, Hkv, dh, device, repeat, backends):
    q, k = torch.randn(B, T, H, dh, device=device), torch.randn(B, T, Hkv, dh, device=device)
    ind = (torch.rand(B, T, Hkv, 2, device=device) < 0.3).float()
    sink = torch.zeros(H, device=device)
    with torch.no_grad():
        rows = [("naive eager (T x T)", timeit(lambda: naive_row_masses(q, k, ind, sink), repeat))]
        for backend in backends:
            rows.append(
                (
                    f"row_masses[{backend}]",
                    timeit(lambda backend=backend: attention_row_masses(q, k, ind, sink=sink, backend=backend), repeat),
                )
            )
    report(f"attention_row_masses fwd  B={B} T={T} H={H} Hkv={Hkv} dh={dh}", rows, rows[0][0])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--T", type=int, default=None, help="sequence length (default 2048 on CUDA, 512 on CPU)")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--interpret", action="store_true", help="time the Triton interpreter on CPU at tiny shapes")
    args = p.parse_args()
    cuda = torch.cuda.is_available()
    if args.interpret:
        if os.environ.get("TRITON_INTERPRET") != "1":
            raise SystemExit("set TRITON_INTERPRET=1 in the environment for --interpret")
        both = ["reference", "triton"]
        print("Triton interpreter: this checks that the paths run; its timings say nothing about GPU performance.")
        bench_sink(1, 32, 2, 1, 16, torch.float32, "cpu", 2, both)
        bench_depth(4, 1, 32, 32, 8, torch.float32, "cpu", 2, both)
        bench_masses(1, 32, 2, 1, 16, "cpu", 2, both)
        return
    if cuda:
        T = args.T or 2048
        bench_sink(4, T, 16, 4, 64, torch.bfloat16, "cuda", args.repeat, ["reference", "sdpa", "triton"])
        bench_depth(13, 8, T, 1024, 64, torch.bfloat16, "cuda", args.repeat, ["reference", "triton"])
        bench_masses(4, T, 16, 4, 64, "cuda", args.repeat, ["torch", "triton"])
    else:
        T = args.T or 512
        torch.manual_seed(0)
        bench_sink(1, T, 8, 2, 64, torch.float32, "cpu", args.repeat, ["reference", "sdpa"])
        bench_depth(13, 2, T, 256, 32, torch.float32, "cpu", args.repeat, ["reference"])
        bench_masses(1, T, 8, 2, 64, "cpu", args.repeat, ["reference", "torch"])


if __name__ == "__main__":
    main()
