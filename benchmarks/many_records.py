"""Reading a few windows from a JSON-lines corpus of many tiny records: the cost must grow with the windows used, not
with the records (docs/definitions.md#streamed-corpora; beside benchmarks/streaming_corpora.py).

A ``.jsonl`` of ``--records`` records (default 4M) of ten words each (about 12 tokens of probe-bpe-8k) is written to
a temporary folder; each case builds two windows with ``probe.data.windows.build_windows`` in a fresh subprocess and
reports its wall time and peak resident memory (``ru_maxrss``):

- ``packed``, ctx 64: the records joined by EOS, two windows cut from the start (a dozen records read);
- ``auto`` (first), ctx 8: two records that hold a window each, in the seeded order of the first block of 65,536;
- the same two cases on a copy of the file with a tenth of the records, to show what grows with them (the hash of
  the file's bytes: the fingerprint, read at C speed) and what does not (parsing and tokenizing).

    python benchmarks/many_records.py                  # 4M records
    python benchmarks/many_records.py --records 400000
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """
import resource, sys, time
t = time.perf_counter()
from probe.data.tokenizer import load_tokenizer
from probe.data.windows import build_windows
tok = load_tokenizer()
start = time.perf_counter()
eb = build_windows(sys.argv[1], tok, n_batches=1, batch_size=2, ctx=int(sys.argv[3]), mode=sys.argv[2])
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.perf_counter() - start, eb.mode, eb.corpus_fingerprint)
"""
WORDS = "the quick brown fox jumps over a lazy dog and then some more words".split()


def write_records(path: Path, n: int) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            words = " ".join(WORDS[(i + k) % len(WORDS)] for k in range(10))
            f.write(json.dumps({"id": i, "text": f"{words}."}) + "\n")


def run(path: Path, mode: str, ctx: int) -> tuple[float, float, str]:
    r = subprocess.run([sys.executable, "-c", CHILD, str(path), mode, str(ctx)], capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(r.stderr[-2000:])
    rss_kb, wall, got, _ = r.stdout.split()
    return int(rss_kb) / 1024, float(wall), got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=4_000_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        big, small = Path(tmp) / "many.jsonl", Path(tmp) / "tenth.jsonl"
        write_records(big, args.records)
        write_records(small, args.records // 10)
        print(f"{'file':<12} {'records':>9} {'MB':>6} {'mode':<7} {'ctx':>3} {'wall s':>7} {'peak MiB':>9}  windows")
        for path, n in ((small, args.records // 10), (big, args.records)):
            for mode, ctx in (("packed", 64), ("auto", 8)):
                rss, wall, got = run(path, mode, ctx)
                size = path.stat().st_size / 1e6
                print(f"{path.name:<12} {n:>9} {size:>6.0f} {mode:<7} {ctx:>3} {wall:>7.2f} {rss:>9.0f}  2 ({got})")


if __name__ == "__main__":
    main()
