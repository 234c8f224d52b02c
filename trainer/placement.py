"""Where a training process runs: its rank among the processes `torchrun` started, its device, and the
autocast type of its steps. Single process by default; with WORLD_SIZE > 1 it joins the process group
(nccl on GPU, gloo on CPU), and only rank 0 writes files."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from model.device import fast_half_dtype, pick_device
from trainer.options import TrainOptions

log = logging.getLogger("trainer")


@dataclass(frozen=True)
class Placement:
    """Where this process runs: its rank among `world` processes and its device."""

    rank: int
    world: int
    device: torch.device

    @property
    def is_writer(self) -> bool:
        return self.rank == 0

    def wait_for_all(self) -> None:
        """A barrier across the processes (nothing to wait for alone)."""
        if self.world > 1:
            dist.barrier()


def place(options: TrainOptions) -> Placement:
    """Join the process group when torchrun started several processes, and pick this one's device."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    rank, local_rank = (dist.get_rank(), int(os.environ.get("LOCAL_RANK", "0"))) if world > 1 else (0, 0)
    placement = Placement(rank, world, pick_device(options.device, local_rank))
    if placement.device.type == "cuda":
        torch.cuda.set_device(placement.device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    return placement


def leave(placement: Placement) -> None:
    if placement.world > 1 and dist.is_initialized():
        dist.destroy_process_group()


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast type of a training step (None: plain float32)."""
    if precision == "float32":
        return None
    if precision == "bfloat16":
        if device.type == "cpu" and fast_half_dtype(device) is None:
            log.warning("--precision bfloat16: this CPU has no native bfloat16 (AVX512-BF16/AMX); it will be slow")
        return torch.bfloat16
    return fast_half_dtype(device) if device.type == "cpu" else torch.bfloat16
