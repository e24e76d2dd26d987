"""Data parallelism for the built-in model: one process per device, under ``torchrun``.

``torchrun`` (``profkit.run.torchrun``) starts the processes and sets ``RANK``,
``WORLD_SIZE`` and ``LOCAL_RANK``; :func:`init` joins the process group (NCCL on CUDA,
gloo on CPU) and picks the process's device, :func:`wrap` makes the model data parallel:

- ``ddp``: ``DistributedDataParallel`` with its default gradient buckets (25 MiB), whose
  all-reduces overlap the backward pass;
- ``fsdp``: FSDP2, ``fully_shard`` on every block and then on the whole model, so that
  parameters, gradients and optimizer state are sharded (all-gather before use,
  reduce-scatter of gradients).

Each rank draws its own batch (the seed plus the rank), so ``--batch`` is per rank.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import nn

from profkit.workload.config import MULTICAST_OFF, PARALLELS

__all__ = ["MULTICAST_OFF", "PARALLELS", "Ranks", "finish", "from_env", "init", "wrap"]


@dataclass(frozen=True)
class Ranks:
    """Where this process stands in the job."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def from_env() -> Ranks:
    """The rank, world size and local rank torchrun set (a single process without it)."""
    return Ranks(
        rank=int(os.environ.get("RANK", 0)),
        world_size=int(os.environ.get("WORLD_SIZE", 1)),
        local_rank=int(os.environ.get("LOCAL_RANK", 0)),
    )


def init(device: torch.device) -> tuple[Ranks, torch.device]:
    """Join the process group (once) and return this rank and its device."""
    import torch.distributed as dist

    ranks = from_env()
    if not ranks.distributed:
        return ranks, device
    for key, value in MULTICAST_OFF.items():
        os.environ.setdefault(key, value)
    if device.type == "cuda":
        device = torch.device("cuda", ranks.local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    return ranks, device


def wrap(model: nn.Module, parallel: str, device: torch.device) -> nn.Module:
    """``model`` made data parallel across the process group (``ddp`` or ``fsdp``)."""
    if parallel == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in getattr(model, "layers", []):
            fully_shard(block)
        fully_shard(model)
        return model
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids)


def finish() -> None:
    """Leave the process group (so that no rank exits while others still wait on it)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
