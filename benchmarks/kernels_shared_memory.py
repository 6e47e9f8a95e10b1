"""Shared memory of every Triton launch, before and after launch settings were fitted to the device, compiled ahead of
time for each GPU arch (no GPU needed).

    python benchmarks/kernels_shared_memory.py --csv benchmarks/kernels_shared_memory.csv

"before": the launchers' old fixed choice on every GPU (64 x 64 tiles, 4 warps, Triton's default 3 stages; depth its
row/slice rule with the defaults), which is what launch_config returns when the limit is unbounded; "after": what
launch_config returns under each arch's limit. The launchers run on tiny CPU tensors under those limits
(probe.kernels.cases.capture, the table_cases shapes), the launches are recorded, and each distinct (launch, arch) is
compiled once (probe.kernels.aot.compile_pairs) whether it serves before, after or both. A row per (when, kernel,
case, arch): settings, shared bytes, the arch's limit, registers and spills from ptxas -v, compile seconds. Rows are
written as their compiles finish.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TRITON_INTERPRET", "1")  # the capture runs the launchers' Python on CPU tensors

from probe.kernels.aot import compile_pairs  # noqa: E402
from probe.kernels.cases import capture, table_cases  # noqa: E402
from probe.kernels.launch import ARCHS, DeviceLimits  # noqa: E402

FIELDS = [
    "when",
    "kernel",
    "dtype",
    "head_dim",
    "flags",
    "arch",
    "blocks",
    "num_warps",
    "num_stages",
    "shared_bytes",
    "limit_bytes",
    "fits",
    "registers",
    "spill_bytes",
    "compile_s",
    "case",
]
UNBOUNDED = 1 << 40


def captures(archs, with_fp32_256: bool = False):
    """{(when, arch): {spec: [case, ...]}} for before (unbounded limits: the old fixed choice) and after."""
    out = {}
    for arch in archs:
        limits = ARCHS[arch]
        # fp32 at head dim 256 takes Triton minutes per kernel and arch to compile (2-8 with 64 x 64 tiles, 1-3 with
        # the fitted ones): left out unless asked for (--with-fp32-256)
        cases = [c for c in table_cases() if with_fp32_256 or not (c.dtype == "fp32" and c.head_dim == 256)]
        out["before", arch] = capture(cases, DeviceLimits(f"{arch} unbounded", limits.capability, UNBOUNDED))
        out["after", arch] = capture(cases, limits)
    return out


def row(when, arch, result, case) -> dict:
    c = dict(result.spec.constexprs)
    return dict(
        when=when,
        kernel=result.spec.name + (" (row masses)" if case.op == "row_masses" else ""),
        dtype=case.dtype,
        head_dim=case.head_dim,
        flags=case.flags(),
        arch=arch,
        blocks="x".join(f"{k.removeprefix('BLOCK_')}{v}" for k, v in c.items() if k.startswith("BLOCK_")),
        num_warps=result.spec.num_warps,
        num_stages=result.spec.num_stages,
        shared_bytes=result.shared,
        limit_bytes=ARCHS[arch].shared_bytes,
        fits=result.fits,
        registers=result.registers,
        spill_bytes=result.spill_bytes,
        compile_s=round(result.seconds, 1),
        case=case.label(),
    )


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--csv", type=Path, required=True)
    p.add_argument("--arch", action="append", choices=list(ARCHS), help="default: every arch")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument(
        "--with-fp32-256", action="store_true", help="also compile fp32 at head dim 256 (minutes per launch)"
    )
    args = p.parse_args()
    archs = args.arch or list(ARCHS)
    caps = captures(archs, args.with_fp32_256)
    pairs = [(spec, arch) for (_, arch), by_spec in caps.items() for spec in by_spec]
    print(f"{len(dict.fromkeys(pairs))} distinct compiles", flush=True)
    t0 = time.perf_counter()
    rows = []
    with args.csv.open("w", newline="") as f:
        w = csv.DictWriter(f, FIELDS)
        w.writeheader()

        def write(result):
            for (when, arch), by_spec in caps.items():
                if arch == result.arch and result.spec in by_spec:
                    for case in by_spec[result.spec]:
                        rows.append(row(when, arch, result, case))
                        w.writerow(rows[-1])
            f.flush()

        compile_pairs(pairs, jobs=args.jobs, timeout=7200, on_result=write)
    print(f"compiled in {time.perf_counter() - t0:.0f} s")
    rows.sort(key=lambda d: (d["when"] != "before", d["kernel"], d["dtype"], int(d["head_dim"]), d["flags"], d["arch"]))
    with args.csv.open("w", newline="") as f:
        w = csv.DictWriter(f, FIELDS)
        w.writeheader()
        w.writerows(rows)
    for when in ("before", "after"):
        mine = [r for r in rows if r["when"] == when]
        over = [r for r in mine if not r["fits"]]
        print(f"{when}: {len(mine)} launches, {len(over)} over their arch's limit")
        for r in over:
            print(
                f"  {r['kernel']} {r['dtype']} dh={r['head_dim']} {r['flags']} {r['arch']}: {r['shared_bytes']} > "
                f"{r['limit_bytes']}"
            )


if __name__ == "__main__":
    main()
