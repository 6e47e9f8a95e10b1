"""Peak memory of building the same evaluation windows from large corpus files and from the bundled text.

Each case runs in a fresh subprocess that builds 2 x 8 windows of 64 tokens (probe-bpe-8k, --window-mode auto) with
``probe.data.windows.build_windows`` and reports its peak resident memory (``ru_maxrss``) and wall time. The large
files are generated in a temporary folder and removed afterwards:

- a 200 MB single-document ``.jsonl`` (one record),
- a ``.jsonl.gz`` of a few MB that inflates to one 2 GB record,
- a 1 GB ``.txt`` of blank-line-separated paragraphs (the bundled WikiText-2 test text, repeated),
- and in ``--window-mode random`` (which counts every token of the corpus) a ``--random-mb`` MB ``.txt`` of the same
  paragraphs against the bundled text in random mode.

    python benchmarks/streaming_corpora.py            # all cases
    python benchmarks/streaming_corpora.py --gb 0.2   # smaller .txt / .gz, for a quick look

The goal (streaming corpora): every file within 200 MB of the bundled text's peak.
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = """
import resource, sys, time
t = time.perf_counter()
from probe.data.tokenizer import load_tokenizer
from probe.data.windows import build_windows
tok = load_tokenizer()
eb = build_windows(sys.argv[1], tok, n_batches=2, batch_size=8, ctx=64, mode=sys.argv[2])
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.perf_counter() - t, eb.mode, eb.corpus_fingerprint)
"""


def write_inputs(folder: Path, gb: float, random_mb: float) -> dict[tuple[str, str], Path | str]:
    from probe.data.corpus import CORPUS_DIR

    text = (CORPUS_DIR / "wikitext-2-test.txt").read_text(encoding="utf-8")
    paragraph = "The quick brown fox jumps over the lazy dog; " * 20 + "\n"
    one = folder / "one-record-200MB.jsonl"
    with open(one, "w", encoding="utf-8") as f:  # one JSON string written in parts, never held whole
        f.write('{"text": "')
        for _ in range(200_000_000 // len(paragraph)):
            f.write(json.dumps(paragraph)[1:-1])
        f.write('"}\n')
    gz = folder / f"one-record-inflating-{2 * gb:g}GB.jsonl.gz"
    with gzip.open(gz, "wt", encoding="utf-8", compresslevel=6) as f:
        f.write('{"id": 0, "text": "')
        block = json.dumps(paragraph * 1000)[1:-1]
        for _ in range(int(2 * gb * 1e9) // len(block)):
            f.write(block)
        f.write('"}\n')
    txt = folder / f"paragraphs-{gb:g}GB.txt"
    with open(txt, "w", encoding="utf-8") as f:
        for _ in range(int(gb * 1e9) // len(text)):
            f.write(text + "\n\n")
    small = folder / f"paragraphs-{random_mb:g}MB.txt"
    with open(small, "w", encoding="utf-8") as f:
        for _ in range(max(1, int(random_mb * 1e6) // len(text))):
            f.write(text + "\n\n")
    return {
        ("bundled wikitext-2-test", "auto"): "wikitext-2-test",
        (one.name, "auto"): one,
        (gz.name, "auto"): gz,
        (txt.name, "auto"): txt,
        ("bundled wikitext-2-test", "random"): "wikitext-2-test",
        (small.name, "random"): small,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gb", type=float, default=1.0, help="size of the .txt in GB (the .gz inflates to twice it)")
    ap.add_argument("--random-mb", type=float, default=20.0, help="size of the .txt read in random mode, in MB")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="probe-streaming-") as tmp:
        t = time.perf_counter()
        cases = write_inputs(Path(tmp), args.gb, args.random_mb)
        print(f"inputs written in {time.perf_counter() - t:.0f} s")
        base = {}
        for (label, mode), data in cases.items():
            size = Path(data).stat().st_size if isinstance(data, Path) else None
            out = subprocess.run([sys.executable, "-c", CHILD, str(data), mode], capture_output=True, text=True)
            if out.returncode:
                print(f"{label}: failed: {out.stderr.strip().splitlines()[-1]}")
                continue
            rss_kb, wall, used, fingerprint = out.stdout.split()
            peak = int(rss_kb) / 1024
            base.setdefault(mode, peak)
            on_disk = f"{size / 1e6:,.0f} MB on disk" if size else "bundled"
            print(
                f"--window-mode {mode}: {label} ({on_disk}): peak {peak:,.0f} MiB ({peak - base[mode]:+,.0f} vs "
                f"bundled), {float(wall):.1f} s, windows {used}, fingerprint {fingerprint}",
                flush=True,
            )


if __name__ == "__main__":
    main()
