"""A local checkpoint's sizes and files, checked before anything is allocated or read.

- Every size its config states (layers, widths, heads, vocabulary, context; any format: HF, probe's, MUDD's
  config.json, LR-AttnRes's model_args) is an integer within a bound no released model comes near, and every other
  value probe reads (experts per token, rotary fraction and base, norm epsilon, model_type...) within its range:
  the one table of them is ``probe.checkpoints.config_ranges.RANGES`` (:func:`check_config`), so nothing is built
  from an absurd one, not even on the meta device.
- A config that declares no quantisation holds floats: an integer or bool weight in its safetensors headers is one
  line, not a silent cast (:func:`check_integer_tensors`; ``INTEGER_BUFFERS`` are the integer buffers that pass).
- Every file a loader reads from the model folder is a regular file (a FIFO would block the read forever), and a
  name a shard index gives is a relative path inside the folder (:func:`model_file`).
- The parameter count its config implies (the model built on the meta device: shapes, no storage) must match what
  its safetensors headers hold (read without loading: the 8-byte header length and the JSON header of each file),
  and the weights must fit the memory available.

A config whose sizes are absurd, a file that is not one, or weights cut short, is one line here, not an allocation
until memory runs out, a read that never returns or a library's report table after it."""

from __future__ import annotations

import json
import math
import os
import stat
import struct
from pathlib import Path

from probe.checkpoints.config_ranges import BOUNDS, RANGES, SIZE_KEYS, config_problem
from probe.data.limits import available_memory, file_kind, human_bytes

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


def check_config(config: dict, name: str, where: str = "config") -> None:
    """Every value ``config`` states (at any depth of nested dicts: a ``text_config``) that probe reads is within its
    range in the one table of them, ``probe.checkpoints.config_ranges.RANGES``: each size an integer (or an integral
    number, or null) from 1 to its kind's bound in ``BOUNDS``, a rotary fraction in (0, 1], a top-k at most the
    number of experts, a rotary base and a query scale > 0, a norm epsilon >= 0, ``model_type`` a string; else one
    CheckpointSizeError line naming the key, the value and the valid range. Cheap: the config is not built."""
    if not isinstance(config, dict):
        raise CheckpointSizeError(f"{name}: its {where} is a JSON {type(config).__name__}, not an object")
    problem = config_problem(config, where)
    if problem is not None:
        raise CheckpointSizeError(f"{name}: {problem}")


# integer tensors a float checkpoint may hold (buffers, never weights), by the last part of their name; any other
# integer or bool tensor without a quantization_config would be cast to floats by the loader, its numbers changed
INTEGER_BUFFERS = (
    "position_ids",  # the position ids older BERT-style and GPT-2 checkpoints saved
    "token_type_ids",
    "num_batches_tracked",  # batch norm's step counter
    "tid2eid",  # DeepSeek-V4's hash-routing table (token id -> expert ids), int64
)
MASK_BUFFERS = ("attn.bias", "attn.masked_bias", "attention.bias", "attention.masked_bias")  # GPT-2/Neo/J causal masks
INTEGER_DTYPES = {"I8", "U8", "I16", "U16", "I32", "U32", "I64", "U64", "BOOL"}


def integer_buffer(tensor: str, dtype: str) -> bool:
    """A tensor name of ``INTEGER_BUFFERS`` (any integer dtype), or an old causal mask (bool / uint8)."""
    if tensor.rsplit(".", 1)[-1] in INTEGER_BUFFERS:
        return True
    return dtype in ("BOOL", "U8") and tensor.endswith(MASK_BUFFERS)


def check_integer_tensors(config: dict, files: list[Path], name: str, headers: dict | None = None) -> None:
    """A checkpoint whose config declares no quantisation (no ``quantization_config``) holds floats: an integer or
    bool weight in its safetensors headers (int8 left by a quantiser whose config was lost) is one line naming the
    file, the tensor and its dtype, instead of a silent cast. ``INTEGER_BUFFERS`` (and old causal masks) pass."""
    if not isinstance(config, dict) or config.get("quantization_config"):
        return
    for path in files:
        for tensor, (dtype, _) in (headers[path] if headers else header_tensors(path)).items():
            if dtype in INTEGER_DTYPES and not integer_buffer(tensor, dtype):
                raise CheckpointSizeError(
                    f"{name}: {path.name} holds tensor {tensor} as {dtype}, and its config declares no quantisation "
                    "(no quantization_config), so probe will not cast it to floats; save the weights as floats, or "
                    "restore the quantization_config of the quantiser that wrote them"
                )


def model_file(folder: Path, name: str, what: str = "file") -> Path:
    """``folder / name`` for a file a loader is about to read: ``name`` (as a shard index gives it) a relative path
    that stays inside ``folder``, and the file a regular one (a link to one is fine: the hub cache's are); else one
    CheckpointSizeError line naming it."""
    folder = Path(folder)
    if not isinstance(name, str) or not name or Path(name).is_absolute() or ".." in Path(name).parts:
        raise CheckpointSizeError(
            f"{folder}: its index names {what} {str(name)[:120]!r}, which is not a file inside the model folder; "
            "an index names files beside it"
        )
    return checked_file(folder / name, what)


def checked_file(path: Path, what: str = "file") -> Path:
    """``path`` is a regular file (a link to one is fine; a FIFO or a device would block or never end): one
    CheckpointSizeError line else."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise CheckpointSizeError(f"{what} {path}: cannot read it ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise CheckpointSizeError(
            f"{what} {path} is {file_kind(path, st.st_mode)}, not a regular file; a model folder holds regular files"
        )
    return Path(path)


READ_SUFFIXES = (".json", ".safetensors", ".bin", ".model", ".txt", ".pt", ".pth", ".gguf", ".tiktoken")


def check_folder_files(folder: Path) -> None:
    """Every file of a model folder that a loader (probe's, transformers', a tokenizer) may open is a regular file:
    a FIFO or a device named ``tokenizer.json`` or ``model.safetensors`` would block the load forever."""
    for entry in Path(folder).iterdir():
        if entry.name.endswith(READ_SUFFIXES) or entry.name.startswith("tokenizer"):
            if not entry.is_file() and not entry.is_dir():
                checked_file(entry, "model file")


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a model directory: those its index names (each inside the folder and a regular
    file), else ``model.safetensors`` where there is one (what transformers loads: a training checkpoint's
    ``state.safetensors`` beside it is optimizer state, not weights), else ``*.safetensors`` (each a regular file)."""
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if os.path.lexists(index):
        checked_file(index, "the shard index")
        try:
            names = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
            raise CheckpointSizeError(f"{index} is not a safetensors index (no weight_map)") from None
        return [model_file(folder, n, "weight file") for n in names]
    if os.path.lexists(folder / "model.safetensors"):
        return [checked_file(folder / "model.safetensors", "weight file")]
    return [checked_file(f, "weight file") for f in sorted(folder.glob("*.safetensors"))]


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
    headers = stored_headers(folder)
    return (*_counts(headers), list(headers))


def stored_headers(folder: Path) -> dict[Path, dict[str, tuple[str, tuple[int, ...]]]]:
    """Each safetensors file of a model directory -> its header's tensors (``header_tensors``), read once."""
    return {path: header_tensors(path) for path in weight_files(folder)}


def _counts(headers: dict) -> tuple[int, int]:
    n_params = n_bytes = 0
    for tensors in headers.values():
        for dtype, shape in tensors.values():
            numel = math.prod(shape)
            n_params += numel
            n_bytes += numel * DTYPE_BYTES.get(dtype, 4)
    return n_params, n_bytes


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
    config = folder / "config.json"
    try:
        saved = json.loads(checked_file(config, "config").read_text(encoding="utf-8"))
        check_config(saved, name)
    except (OSError, ValueError, RecursionError) as e:
        if isinstance(e, CheckpointSizeError):
            raise
        raise CheckpointSizeError(f"{name}: {config} is not a JSON config ({type(e).__name__})") from None
    headers = stored_headers(folder)  # every header read once, for the integer check and the counts
    if not headers:
        return
    check_integer_tensors(saved, list(headers), name, headers)
    stored, stored_bytes = _counts(headers)
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


__all__ = [
    "BOUNDS",
    "INTEGER_BUFFERS",
    "RANGES",
    "SIZE_KEYS",
    "CheckpointSizeError",
    "check_config",
    "check_integer_tensors",
    "check_folder_files",
    "check_sizes",
    "checked_file",
    "header_tensors",
    "implied_counts",
    "model_file",
    "stored_counts",
    "weight_files",
]
