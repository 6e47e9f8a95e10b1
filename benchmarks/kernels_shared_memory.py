"""Shared memory of every Triton launch the launchers choose, compiled ahead of time for each GPU arch (no GPU needed).

    python benchmarks/kernels_shared_memory.py --when after --csv benchmarks/kernels_shared_memory.csv

For each arch the launchers run on tiny CPU tensors under that arch's device limits (probe.kernels.cases.capture), the
launches are recorded, and each distinct one is compiled for the arch (probe.kernels.aot.compile_specs). A row per
(table case's kernel, arch): kernel, dtype, head dim, flags, arch, launch settings, shared bytes, the arch's limit,
registers and spills from ptxas -v. ``--when`` labels the rows; rows of other labels already in the CSV are kept, so
one file holds the table before and after a change to the launchers.
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
from probe.kernels.launch import ARCHS  # noqa: E402

FIELDS = ["when", "kernel", "dtype", "head_dim", "flags", "arch", "blocks", "num_warps", "num_stages", "shared_bytes",
          "limit_bytes", "fits", "registers", "spill_bytes", "cases"]


def rows_for(when: str, archs, jobs: int):
    by_arch = {arch: capture(table_cases(), ARCHS[arch]) for arch in archs}
    t0 = time.perf_counter()
    results = compile_pairs([(spec, arch) for arch in archs for spec in by_arch[arch]], jobs=jobs)
    print(f"{len(results)} compiles in {time.perf_counter() - t0:.0f} s", flush=True)
    rows = []
    for r in results:
        cases = by_arch[r.arch][r.spec]
        first = cases[0]
        c = dict(r.spec.constexprs)
        rows.append(dict(
            when=when, kernel=r.spec.name, dtype=first.dtype, head_dim=first.head_dim,
            flags=first.flags(), arch=r.arch,
            blocks="x".join(f"{k.removeprefix('BLOCK_')}{v}" for k, v in c.items() if k.startswith("BLOCK_")),
            num_warps=r.spec.num_warps, num_stages=r.spec.num_stages, shared_bytes=r.shared,
            limit_bytes=ARCHS[r.arch].shared_bytes, fits=r.fits, registers=r.registers, spill_bytes=r.spill_bytes,
            cases="; ".join(sorted({c.label() for c in cases}))))
    return sorted(rows, key=lambda d: (d["kernel"], d["dtype"], int(d["head_dim"]), d["flags"], d["arch"]))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--when", required=True, help="label of these rows, e.g. before / after")
    p.add_argument("--csv", type=Path, required=True)
    p.add_argument("--arch", action="append", choices=list(ARCHS), help="default: every arch")
    p.add_argument("--jobs", type=int, default=2)
    args = p.parse_args()
    rows = rows_for(args.when, args.arch or list(ARCHS), args.jobs)
    kept = []
    if args.csv.exists():
        with args.csv.open() as f:
            kept = [r for r in csv.DictReader(f) if r["when"] != args.when]
    with args.csv.open("w", newline="") as f:
        w = csv.DictWriter(f, FIELDS)
        w.writeheader()
        w.writerows(kept + rows)
    over = [r for r in rows if not r["fits"]]
    print(f"{len(rows)} launches, {len(over)} over their arch's limit")
    for r in over:
        print(f"  {r['kernel']} {r['dtype']} dh={r['head_dim']} {r['flags']} {r['arch']}: {r['shared_bytes']} > "
              f"{r['limit_bytes']}")


if __name__ == "__main__":
    main()
