"""Two windows of a .jsonl.gz corpus of a million one-token records (``{"text": "a"}``), against a tiny file of the
same records (docs/definitions.md#streamed-corpora; beside benchmarks/many_records.py).

Each case builds two windows of ctx 64 (``probe sinks --data FILE --batches 1 --batch-size 2 --ctx 64``) with
``probe.data.windows.build_windows`` in a fresh subprocess and prints its wall time and outcome:

- ``packed``: the records joined by EOS, two windows cut from the start: a few dozen records are read;
- ``auto``: the command line's default. No one-token record holds a window of 65 tokens, so mode first falls back
  to sequential, which must look at every record before it can say that none does (an error naming the corpus):
  this case reads the whole file. It ran over 90 s (the gzip stream inflated again from its start for every batch
  of documents visited in the seeded order); the documents are now sliced from the recently inflated chunks.

    python benchmarks/large_jsonl.py                   # 10^6 records
    python benchmarks/large_jsonl.py --records 100000
"""

from __future__ import annotations

import argparse
import gzip
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """
import sys, time
from probe.data.tokenizer import load_tokenizer
from probe.data.windows import build_windows
tok = load_tokenizer()
start = time.perf_counter()
try:
    eb = build_windows(sys.argv[1], tok, n_batches=1, batch_size=2, ctx=64, mode=sys.argv[2])
    got = f"{eb.tokens.shape[1]} windows ({eb.mode})"
except ValueError as e:
    got = "error: " + str(e)[:60] + "..."
print(f"{time.perf_counter() - start:.2f}\\t{got}")
"""
RECORD = b'{"text": "a"}\n'


def run(path: Path, mode: str) -> tuple[float, str]:
    r = subprocess.run([sys.executable, "-c", CHILD, str(path), mode], capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(r.stderr[-2000:])
    wall, got = r.stdout.strip().split("\t")
    return float(wall), got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        big, small = Path(tmp) / "million.jsonl.gz", Path(tmp) / "tiny.jsonl.gz"
        big.write_bytes(gzip.compress(RECORD * args.records, compresslevel=1))
        small.write_bytes(gzip.compress(RECORD * 1000, compresslevel=1))
        print(f"{'file':<16} {'records':>9} {'mode':<7} {'wall s':>7}  outcome")
        for path, n in ((small, 1000), (big, args.records)):
            for mode in ("packed", "auto"):
                wall, got = run(path, mode)
                print(f"{path.name:<16} {n:>9} {mode:<7} {wall:>7.2f}  {got}")


if __name__ == "__main__":
    main()
