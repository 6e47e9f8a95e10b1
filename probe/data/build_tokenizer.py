"""Regenerate the shipped tokenizer: ``python -m probe.data.build_tokenizer [--check]``.

Trains ``train_bpe`` (vocab 8192) on the bundled training mix (shakespeare + kjv + wikitext-2-valid, in that order) and
writes ``probe/data/tokenizer/probe-bpe-8k.json``. The result is byte-identical on reruns with the same ``tokenizers``
version; ``--check`` retrains and compares with the shipped file instead of writing it.
"""

from __future__ import annotations

import argparse
import hashlib
import sys

from probe.data.corpus import load_corpus
from probe.data.tokenizer import TOKENIZER_DIR, train_bpe
from probe.writes import atomic_write

OUT = TOKENIZER_DIR / "probe-bpe-8k.json"


def build() -> str:
    """The tokenizer JSON as a string (the backend's canonical serialisation)."""
    tok = train_bpe(load_corpus("train").documents, vocab_size=8192)
    return tok.backend_tokenizer.to_str(pretty=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the shipped file instead of writing it")
    args = ap.parse_args(argv)
    text = build()
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    if args.check:
        same = OUT.exists() and OUT.read_text(encoding="utf-8") == text
        print(f"{OUT.name}: {'matches' if same else 'DIFFERS from'} a fresh build (sha256 {digest})")
        return 0 if same else 1
    atomic_write(OUT, text)  # the shipped file is whole or unchanged
    print(f"wrote {OUT} ({len(text) / 1e6:.2f} MB, sha256 {digest})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
