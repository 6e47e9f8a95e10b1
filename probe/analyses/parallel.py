"""Data-parallel analyses: under ``torch.distributed`` (e.g. ``torchrun``) each rank takes whole evaluation batches by
global index and the accumulators are merged afterwards; outside it everything runs in this process.

Batches are dealt round-robin (batch n goes to rank n mod world), so per-batch randomness keyed by the global index
(injection's (seed, batch, layer) draws, structured-junk pools inside a batch) is the same whatever the number of
ranks, and a rank may get no batch at all. Merging: sums are all-reduced, per-batch rows and other Python objects are
gathered and put back in global order. Every rank ends with the same merged result; callers let rank 0 write.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from probe.process_group import rank_and_world


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
    "all_sum",
    "reduce_sums",
    "gather",
    "gather_rows",
    "first_present",
]
