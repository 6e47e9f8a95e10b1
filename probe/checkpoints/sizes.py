"""A local checkpoint's sizes, checked before anything is allocated: the parameter count its config implies (the
model built on the meta device: shapes, no storage) must match what its safetensors headers hold (read without
loading: the 8-byte header length and the JSON header of each file), and the weights must fit the memory available.
A config whose sizes are absurd, or weights cut short, is one line here, not an allocation until memory runs out or
a library's report table after it."""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path

from probe.data.limits import available_memory, human_bytes

MAX_HEADER_BYTES = 100 << 20  # safetensors caps its JSON header at 100 MB
DTYPE_BYTES = {
    "F64": 8,
    "I64": 8,
    "U64": 8,
    "F32": 4,
    "I32": 4,
    "U32": 4,
    "F16": 2,
    "BF16": 2,
    "I16": 2,
    "U16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}


class CheckpointSizeError(ValueError):
    """A checkpoint whose config, weights and memory disagree; the message is one line."""


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a model directory: those its index names, else ``*.safetensors``."""
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            raise CheckpointSizeError(f"{index} is not a safetensors index (no weight_map)") from None
        return [folder / n for n in names]
    return sorted(folder.glob("*.safetensors"))


def header_tensors(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """tensor name -> (dtype, shape) from one safetensors file's header, checked against the file's size."""
    path = Path(path)
    try:
        size = os.stat(path).st_size
        with open(path, "rb") as f:
            head = f.read(8)
            n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
            if not 0 < n <= min(MAX_HEADER_BYTES, size - 8):
                raise CheckpointSizeError(f"{path} is not a safetensors file (header length {n}, file of {size} bytes)")
            header = json.loads(f.read(n))
    except OSError as e:
        raise CheckpointSizeError(f"{path}: cannot read it ({e.strerror})") from None
    except ValueError as e:
        if isinstance(e, CheckpointSizeError):
            raise
        raise CheckpointSizeError(f"{path} is not a safetensors file (its header is not JSON)") from None
    tensors, end = {}, 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (_, stop) = info["dtype"], tuple(int(d) for d in info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise CheckpointSizeError(f"{path}: tensor {name!r} has a malformed header entry") from None
        tensors[name] = (dtype, shape)
        end = max(end, int(stop))
    if 8 + n + end > size:
        raise CheckpointSizeError(
            f"{path} is truncated: its header describes {8 + n + end} bytes, the file holds {size}"
        )
    return tensors


def stored_counts(folder: Path) -> tuple[int, int, list[Path]]:
    """(parameters, bytes, files) that a model directory's safetensors headers hold."""
    files = weight_files(folder)
    n_params = n_bytes = 0
    for path in files:
        for dtype, shape in header_tensors(path).values():
            numel = math.prod(shape)
            n_params += numel
            n_bytes += numel * DTYPE_BYTES.get(dtype, 4)
    return n_params, n_bytes, files


def implied_counts(folder: Path) -> tuple[int, int, str] | None:
    """(distinct parameters, every state-dict entry's elements) of the model the config in ``folder`` describes, built
    on the meta device; None when the architecture cannot be built so (then the loader's own checks apply).

    The saved weights hold each distinct parameter at least once (tied ones may be stored once) and at most every
    state-dict entry (tied copies and persistent buffers included)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(folder)
        if getattr(config, "quantization_config", None):  # packed weights (MXFP4, GPTQ): fewer stored elements
            return None
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except Exception:  # noqa: BLE001 - an architecture this cannot build: the loader's checks remain
        return None
    distinct = sum(p.numel() for p in model.parameters())
    state = sum(t.numel() for t in model.state_dict().values())
    return distinct, max(state, distinct), getattr(config, "model_type", "")


def check_sizes(folder, name: str, dtype_bytes: int | None = None, *, check_memory: bool = True) -> None:
    """Before ``from_pretrained``: the config's parameter count matches the safetensors headers, and the weights
    (``dtype_bytes`` per parameter, None: as stored) fit the memory available; else one ``CheckpointSizeError`` line
    saying which and by how much. A directory without safetensors files is left to the loader."""
    folder = Path(folder)
    stored, stored_bytes, files = stored_counts(folder)
    if not files:
        return
    implied = implied_counts(folder)
    if implied is not None:
        low, high, model_type = implied
        # a probe checkpoint holds exactly its state; a hub architecture's files may carry tensors its loader
        # ignores (old GPT-2 attention masks), so there only fewer weights than the config implies is refused
        if stored < low or (model_type == "probe" and stored > high):
            off = stored - low if stored < low else stored - high
            raise CheckpointSizeError(
                f"{name}: its config implies {low:,} parameters, its safetensors headers hold {stored:,} "
                f"({'fewer' if off < 0 else 'more'} by {abs(off):,}); the config and the weights do not belong "
                "together"
            )
    need = stored_bytes if dtype_bytes is None else stored * dtype_bytes
    have = available_memory() if check_memory else None
    if have is not None and need > have:
        raise CheckpointSizeError(
            f"{name}: its weights need {human_bytes(need)}, more than the "
            f"{human_bytes(have)} of memory available (by {human_bytes(need - have)})"
        )


__all__ = ["CheckpointSizeError", "check_sizes", "header_tensors", "implied_counts", "stored_counts", "weight_files"]
