"""DDP under ``torchrun``: initialise from the environment, shard each global batch by rank.

``torchrun --nproc_per_node N script.py`` sets WORLD_SIZE/RANK/LOCAL_RANK/MASTER_ADDR/MASTER_PORT; with WORLD_SIZE > 1
:func:`setup` joins the process group (NCCL on CUDA, gloo on CPU) through ``probe.process_group.join_group``, as
the analysis verbs do. Every rank draws the same global batch from an identically seeded sampler and keeps its own rows
(:func:`shard`), so N processes see exactly the data one process sees. Only rank 0 writes files.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from probe.process_group import DistInfo, from_env, join_group


def setup(device: str = "auto") -> DistInfo:
    """Join the process group that torchrun describes (idempotent); a plain process gets rank 0 of 1."""
    info = from_env()
    if info.enabled:
        join_group(info, cuda=torch.cuda.is_available() and not device.startswith("cpu"))
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
    return batch[info.rank * n : (info.rank + 1) * n]


def mean_over_ranks(x: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized():
        x = x.clone()
        dist.all_reduce(x)
        x /= dist.get_world_size()
    return x
