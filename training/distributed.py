"""Data-parallel training under ``torchrun``: the DistributedDataParallel setup every trainer shares.

``torchrun --nproc_per_node N $(which veil) train uldnet ...`` starts N processes with ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` set; :func:`setup` joins them into one process group (gloo
on CPU, NCCL on GPU). Without those variables everything here is a no-op for one process, so the trainers run
the same code either way.

Same results as one process at the same global batch: every rank draws the same shuffling and augmentation
(same seed) for the whole global batch and trains on its own contiguous slice of it (:func:`shard`); the loss
is scaled by ``local / global * world`` (:func:`loss_scale`) so DDP's gradient average is the global batch's
mean gradient even for an uneven last batch; floating buffers that batches update (PolyNorm's running
variance, BatchNorm statistics) are averaged over the ranks after each step, weighted by the slices' sizes
(:func:`sync_buffers`). What cannot match exactly: statistics a forward computes from its own slice
(BatchNorm in training mode, the PolyNorm running-variance update within that step) and dropout's random
masks; results agree within a small tolerance instead (tests/training/test_distributed.py).

Only rank 0 writes checkpoints, prints results and shows progress bars (:func:`is_main`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True)
class World:
    """This process's place in the job: ``rank`` of ``size`` (size 1: not distributed)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def distributed(self) -> bool:
        return self.size > 1


def setup(backend: str | None = None) -> World:
    """Join the torchrun process group (once per process) and return this process's :class:`World`.

    Args:
        backend: 'gloo' or 'nccl'; default NCCL when CUDA is available, gloo otherwise.

    Raises:
        ValueError: torchrun's ``WORLD_SIZE`` / ``RANK`` are not integers.
    """
    try:
        size, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", "0"))
    except ValueError:
        raise ValueError(f"WORLD_SIZE / RANK / LOCAL_RANK: expected integers (as torchrun sets them), received "
                         f"{os.environ.get('WORLD_SIZE')!r} / {os.environ.get('RANK')!r} / "
                         f"{os.environ.get('LOCAL_RANK')!r}") from None
    if size > 1 and not dist.is_initialized():
        backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        if backend == "nccl":
            torch.cuda.set_device(local)
        dist.init_process_group(backend=backend)
    return World(rank, size, local)


def world() -> World:
    """The current process's :class:`World` (one process when no group is initialized)."""
    if not dist.is_initialized():
        return World()
    return World(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def is_main() -> bool:
    """Whether this process writes checkpoints, prints and shows progress (rank 0, or not distributed)."""
    return world().rank == 0


def wrap(model: nn.Module, find_unused_parameters: bool = False) -> nn.Module:
    """``model`` in DistributedDataParallel when distributed, else itself.

    Buffers are synced at init (every rank built the same model from the same seed anyway) and then by
    :func:`sync_buffers` after each step, not broadcast from rank 0 before each forward.
    ``find_unused_parameters``: for models whose forward may skip trainable parameters (routed adapters)."""
    w = world()
    if not w.distributed:
        return model
    device_ids = [w.local_rank] if dist.get_backend() == "nccl" else None
    return nn.parallel.DistributedDataParallel(model, device_ids=device_ids, forward_sync_buffers=False,
                                               find_unused_parameters=find_unused_parameters)


def shard(indices: torch.Tensor) -> torch.Tensor:
    """This rank's contiguous slice of a global batch's indices (sizes differ by at most one)."""
    w = world()
    if not w.distributed:
        return indices
    return torch.tensor_split(indices, w.size)[w.rank]


def batch_rows(n: int) -> tuple[torch.Tensor, int]:
    """This rank's rows of a global batch of ``n`` samples and how many of them count.

    A rank left without samples (``n`` < world size) gets row 0 with count 0: it still runs forward and
    backward (weight 0, :func:`loss_scale`), so DDP's gradient all-reduce meets every rank."""
    rows = shard(torch.arange(n))
    return (rows, len(rows)) if len(rows) else (torch.arange(1), 0)


def loss_scale(local: int, total: int) -> float:
    """Factor on a rank's mean loss so that DDP's gradient average is the mean gradient over ``total`` samples."""
    return local / total * world().size


def all_sum(value: float) -> float:
    """``value`` summed over the ranks (itself when not distributed)."""
    if not world().distributed:
        return value
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t.item())


def global_mean(value: float, local: int, total: int) -> float:
    """A rank's mean over its ``local`` samples -> the mean over the global batch's ``total`` (``value`` itself
    when not distributed)."""
    return all_sum(value * local) / total if world().distributed else value


def sync_buffers(model: nn.Module, local: int, total: int) -> None:
    """Average the floating buffers over the ranks, each weighted by its slice (``local`` of ``total`` samples)."""
    if not world().distributed:
        return
    for module in model.modules():
        for name, buffer in module.named_buffers(recurse=False):
            # non-persistent buffers are constants (RoPE tables): left exactly as they are
            if buffer.is_floating_point() and name not in module._non_persistent_buffers_set:
                buffer.mul_(local / total)
                dist.all_reduce(buffer)


def barrier() -> None:
    if world().distributed:
        dist.barrier()


def teardown() -> None:
    """Leave the process group (the end of a torchrun job)."""
    if dist.is_initialized():
        dist.destroy_process_group()
