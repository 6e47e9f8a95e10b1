"""DDP under ``torchrun``: initialise from the environment, shard each global batch by rank.

``torchrun --nproc_per_node N script.py`` sets WORLD_SIZE/RANK/LOCAL_RANK/MASTER_ADDR/MASTER_PORT; with WORLD_SIZE > 1
:func:`setup` joins the process group (NCCL on CUDA, gloo on CPU). Every rank draws the same global batch from an
identically seeded sampler and keeps its own rows (:func:`shard`), so N processes see exactly the data one process sees.
Only rank 0 writes files.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
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


def setup(device: str = "auto") -> DistInfo:
    """Join the process group that torchrun describes (idempotent); a plain process gets rank 0 of 1."""
    info = from_env()
    if not info.enabled:
        return info
    cuda = torch.cuda.is_available() and device != "cpu" and not device.startswith("cpu")
    if cuda:
        torch.cuda.set_device(info.local_rank)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    return info


def cleanup():
    if dist.is_initialized():
        dist.destroy_process_group()


def barrier():
    if dist.is_initialized():
        dist.barrier()


def shard(batch: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """This rank's contiguous slice of the global batch (rows)."""
    if batch.shape[0] % info.world_size:
        raise ValueError(f"global batch {batch.shape[0]} is not divisible by world size {info.world_size}")
    n = batch.shape[0] // info.world_size
    return batch[info.rank * n:(info.rank + 1) * n]


def mean_over_ranks(x: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized():
        x = x.clone()
        dist.all_reduce(x)
        x /= dist.get_world_size()
    return x
