"""Training checkpoints without pickle: safetensors for every tensor, JSON for everything else, swapped in atomically.

Layout of ``out_dir/checkpoint/`` (the rest of a run directory: ``probe.runs``)::

    model.safetensors (+ config.json)   via ``save_pretrained`` when the model has it, else the state dict
    state.safetensors                   every tensor of the optimizer, sampler and RNG states
    trainer_state.json                  step, config, and the non-tensor rest of those states (tensors as references)

A checkpoint is written into ``checkpoint.tmp`` and renamed into place; the previous one is kept as ``checkpoint.old``
until the rename has happened, so an interruption at any point leaves one complete checkpoint.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from safetensors.torch import save_model as save_state
from torch import nn

from probe.models.model import current_names
from probe.progress import quiet_hf_bars
from probe.runs import CHECKPOINT
from probe.writes import WriteError, atomic_write, check_real_folders, fsync_tree, staging_dir

STATE_JSON, STATE_TENSORS = "trainer_state.json", "state.safetensors"


def flatten(obj, tensors: dict[str, torch.Tensor]):
    """JSON-able copy of ``obj`` with tensors/arrays moved into ``tensors`` (keys ``t0, t1, …``)."""
    if isinstance(obj, (torch.Tensor, np.ndarray)):
        key = f"t{len(tensors)}"
        is_np = isinstance(obj, np.ndarray)
        tensors[key] = (torch.from_numpy(obj.copy()) if is_np else obj.detach().cpu().clone()).contiguous()
        return {"__ndarray__" if is_np else "__tensor__": key}
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj):
            return {k: flatten(v, tensors) for k, v in obj.items()}
        return {"__items__": [[k, flatten(v, tensors)] for k, v in obj.items()]}
    if isinstance(obj, tuple):
        return {"__tuple__": [flatten(v, tensors) for v in obj]}
    if isinstance(obj, list):
        return [flatten(v, tensors) for v in obj]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"cannot checkpoint a {type(obj).__name__} without pickle")


def unflatten(obj, tensors: dict[str, torch.Tensor]):
    if isinstance(obj, dict):
        if "__tensor__" in obj:
            return tensors[obj["__tensor__"]]
        if "__ndarray__" in obj:
            return tensors[obj["__ndarray__"]].numpy()
        if "__tuple__" in obj:
            return tuple(unflatten(v, tensors) for v in obj["__tuple__"])
        if "__items__" in obj:
            return {k: unflatten(v, tensors) for k, v in obj["__items__"]}
        return {k: unflatten(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [unflatten(v, tensors) for v in obj]
    return obj


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def seed_rngs(seed: int) -> None:
    """Seed every generator whose state a checkpoint records (torch's, Python's, NumPy's): a fresh run's checkpoints
    are then the same bytes on every run of the command, the uninterrupted one and one resumed after a kill alike
    (Python's and NumPy's would otherwise start from the OS's entropy)."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def set_rng_state(state: dict):
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_model(model: nn.Module, path: Path):
    if hasattr(model, "save_pretrained"):
        with quiet_hf_bars():  # no "Writing model shards" bar inside the training loop
            model.save_pretrained(path)
    else:
        save_state(model, str(path / "model.safetensors"))


def export_model(model: nn.Module, path: Path, tokenizer=None, root: Path | None = None) -> Path:
    """A directory that ``probe.load`` / ``--model`` opens: weights (safetensors) + config, and the tokenizer when
    given.

    Written into a temporary sibling and renamed into place, so a reader never sees a half-written model. With
    ``root`` (the run folder), a link planted between it and ``path`` (``snapshots -> /elsewhere``) is a WriteError."""
    path = Path(path)
    if root is not None:
        try:
            check_real_folders(root, path)
        except OSError as e:
            raise WriteError(path, e) from None
    tmp = staging_dir(path.parent, path.name)  # a new folder of a random name: never a planted one
    with _writing(path, tmp):
        save_model(model, tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        fsync_tree(tmp)
    with _writing(path):
        old = None
        if path.exists():
            old = staging_dir(path.parent, f"{path.name}.old")  # empty: the previous model is renamed over it
            os.replace(path, old)
        os.replace(tmp, path)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return path


@contextlib.contextmanager
def _writing(final: Path, staged: Path | None = None):
    """Writes towards ``final``: a failure removes ``staged``, and a failed write (a full disk, a folder removed under
    the run: an OSError, or the SafetensorError safetensors raises for one) is a WriteError naming ``final``."""
    from safetensors import SafetensorError

    try:
        yield
    except BaseException as e:
        if staged is not None:
            shutil.rmtree(staged, ignore_errors=True)
        if isinstance(e, OSError):
            raise WriteError(final, e) from None
        if isinstance(e, SafetensorError):
            raise WriteError(final, OSError(errno.EIO, f"safetensors: {str(e).strip()[:200]}")) from None
        raise


def load_model(model: nn.Module, path: Path):
    """Load weights saved by :func:`save_model` into ``model``; only tied aliases may be missing."""
    index = path / "model.safetensors.index.json"
    files = ["model.safetensors"]
    if index.exists():  # sharded
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    state = {}
    for f in files:
        state.update(read_tensors(path / f, path))
    state = current_names(state)  # a checkpoint written before the value gates became modules
    missing, unexpected = model.load_state_dict(state, strict=False)
    own = model.state_dict(keep_vars=True)
    loaded = {t.data_ptr() for k, t in own.items() if k in state}
    really_missing = [k for k in missing if own[k].data_ptr() not in loaded]
    if unexpected or really_missing:
        raise RuntimeError(
            f"checkpoint {path} does not fit the model: missing {really_missing}, unexpected {unexpected}"
        )


def find_checkpoint(out_dir: Path) -> Path | None:
    """The complete checkpoint in ``out_dir``: ``checkpoint/``, else ``checkpoint.old/`` (an interrupted swap)."""
    for name in (CHECKPOINT, f"{CHECKPOINT}.old"):
        if (out_dir / name / STATE_JSON).exists():
            return out_dir / name
    return None


def read_state(ckpt: Path) -> dict:
    """``ckpt/trainer_state.json``; a damaged one is a ValueError of one line naming it and how to recover."""
    path = Path(ckpt) / STATE_JSON
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(meta, dict) or not isinstance(meta.get("step"), int):
            raise ValueError("no step recorded")
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(
            f"{path} is corrupt ({type(e).__name__}: {str(e).splitlines()[0]}); delete {ckpt} and run "
            f"again to resume from {CHECKPOINT}.old if it is there, else from step 0"
        ) from None
    return meta


def read_tensors(file: Path, ckpt: Path) -> dict[str, torch.Tensor]:
    """The tensors of a checkpoint's safetensors file; a missing, truncated or damaged one is a ValueError of one line
    naming it and how to recover (as :func:`read_state`)."""
    from safetensors import SafetensorError

    try:
        return load_file(str(file))
    except (SafetensorError, OSError, ValueError) as e:
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(
            f"{file} is corrupt ({type(e).__name__}: {why}); delete {ckpt} and run again to resume from "
            f"{CHECKPOINT}.old if it is there, else from step 0"
        ) from None


def save_checkpoint(out_dir: Path, model: nn.Module, optimizer, sampler, step: int, extra: dict | None = None) -> Path:
    out_dir = Path(out_dir)
    final, old = out_dir / CHECKPOINT, out_dir / f"{CHECKPOINT}.old"
    tmp = staging_dir(out_dir, CHECKPOINT)  # a new folder of a random name (two runs never share it)
    with _writing(final, tmp):
        save_model(model, tmp)
        tensors: dict[str, torch.Tensor] = {}
        state = flatten(
            {"optimizer": optimizer.state_dict(), "sampler": sampler.state_dict(), "rng": rng_state()}, tensors
        )
        save_file(tensors, str(tmp / STATE_TENSORS))
        atomic_write(tmp / STATE_JSON, json.dumps({"step": step, **(extra or {}), "state": state}))  # written last
        fsync_tree(tmp)
    with _writing(final):
        if (final / STATE_JSON).exists():
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
        else:
            shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path: Path, model: nn.Module, optimizer=None, sampler=None, restore_rng: bool = True) -> dict:
    """Restore what :func:`save_checkpoint` wrote; returns the JSON metadata (``step``, ``config``, …)."""
    path = Path(path)
    load_model(model, path)
    meta = read_state(path)
    state = unflatten(meta.pop("state"), read_tensors(path / STATE_TENSORS, path))
    if optimizer is not None:
        optimizer.load_state_dict(state["optimizer"])
    if sampler is not None:
        sampler.load_state_dict(state["sampler"])
    if restore_rng:
        set_rng_state(state["rng"])
    return meta
