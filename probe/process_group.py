"""The process group torchrun describes, and this process's place in it: who joins, which rank writes, which
evaluation batches a rank takes. Ground floor: the analyses (``probe.analyses.parallel`` merges their results) and the
trainer (``probe.train.distributed``) join through here, so neither needs the other's package.

Batches are dealt round-robin (batch n goes to rank n mod world), so per-batch randomness keyed by the global index
is the same whatever the number of ranks, and a rank may get no batch at all.
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
