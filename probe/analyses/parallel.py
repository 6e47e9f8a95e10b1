"""Data-parallel analyses: under ``torch.distributed`` (e.g. ``torchrun``) each rank takes whole evaluation batches by
global index and the accumulators are merged afterwards; outside it everything runs in this process.

Batches are dealt round-robin (batch n goes to rank n mod world), so per-batch randomness keyed by the global index
(injection's (seed, batch, layer) draws, structured-junk pools inside a batch) is the same whatever the number of
ranks, and a rank may get no batch at all. Merging: sums are all-reduced, per-batch rows and other Python objects are
gathered and put back in global order. Every rank ends with the same merged result; callers let rank 0 write.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    """This process's place among the ones torchrun started (rank 0 of 1 outside torchrun)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def from_env() -> DistInfo:
    """This process's place among torchrun's, read from the environment without joining anything."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    return DistInfo(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))


def join_group(info: DistInfo, cuda: bool, timeout: timedelta | None = None) -> bool:
    """Join the process group torchrun describes: NCCL with this rank on GPU ``info.local_rank`` when ``cuda``, else
    gloo. A group that already exists (a Python caller's) is used as it is; returns whether this call created it (then
    the caller destroys it when done). The analysis verbs and the trainer both join through here, so neither needs the
    other's package."""
    if dist.is_initialized():
        return False
    if cuda:
        torch.cuda.set_device(info.local_rank)
    dist.init_process_group("nccl" if cuda else "gloo", **({} if timeout is None else {"timeout": timeout}))
    return True


def rank_and_world() -> tuple[int, int]:
    """(rank, world size) of the initialised process group, or (0, 1)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def is_main() -> bool:
    """True on the rank that writes and prints (rank 0, or the only process)."""
    return rank_and_world()[0] == 0


def batches_of_rank(n_batches: int) -> range:
    """The global batch indices this rank evaluates."""
    rank, world = rank_and_world()
    return range(rank, n_batches, world)


def _reduce_tensor(t: torch.Tensor) -> torch.Tensor:
    """Sum of ``t`` over ranks (a new tensor on t's device; NCCL reduces on the current CUDA device)."""
    work = t.detach().clone()
    if dist.get_backend() == "nccl":
        work = work.cuda()
    dist.all_reduce(work, op=dist.ReduceOp.SUM)
    return work.to(t.device)


def all_sum(value):
    """Sum a tensor, a number, or a dict / list of them over ranks (returned, never changed in place)."""
    if rank_and_world()[1] == 1:
        return value
    if isinstance(value, torch.Tensor):
        return _reduce_tensor(value)
    if isinstance(value, dict):
        return {k: all_sum(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(all_sum(v) for v in value)
    if isinstance(value, (int, float)):
        out = _reduce_tensor(torch.tensor(value, dtype=torch.float64)).item()
        return int(out) if isinstance(value, int) else out
    raise TypeError(f"cannot sum a {type(value).__name__} over ranks")


def reduce_sums(accumulator, names) -> None:
    """Replace each named attribute of ``accumulator`` (tensors, numbers or dicts of them) by its sum over ranks."""
    for name in names:
        setattr(accumulator, name, all_sum(getattr(accumulator, name)))


def gather(obj) -> list:
    """Every rank's ``obj``, in rank order (``[obj]`` in one process)."""
    rank, world = rank_and_world()
    if world == 1:
        return [obj]
    out = [None] * world
    dist.all_gather_object(out, obj)
    return out


def gather_rows(rows: list[dict], key: str = "batch") -> list[dict]:
    """Per-batch table rows of every rank, in global order of ``key`` (stable within a batch)."""
    merged = [row for part in gather(rows) for row in part]
    return sorted(merged, key=lambda row: row[key]) if rank_and_world()[1] > 1 else merged


def first_present(values: list) -> list:
    """Per slot, the first rank's value that is not None (e.g. a layer's sink logits, seen by any rank that ran)."""
    parts = gather(values)
    return [next((p[i] for p in parts if p[i] is not None), None) for i in range(len(values))]


__all__ = [
    "DistInfo",
    "from_env",
    "join_group",
    "rank_and_world",
    "is_main",
    "batches_of_rank",
    "all_sum",
    "reduce_sums",
    "gather",
    "gather_rows",
    "first_present",
]
