"""How a head's tensors cross between host and device without the host waiting (every head's module uses these):
its index tensors up, its answers down, and the collector that turns them into results once the batch is done."""

from __future__ import annotations

from typing import Callable

import torch

Collector = Callable[[list], None]  # fills its items' places in a batch's list of results


def to_host(values: torch.Tensor) -> torch.Tensor:
    """A copy on the host, valid once the device has caught up (from CUDA: page-locked, queued, not waited for).
    On a CPU a copy too, not the tensor itself: a graph's output read later would be the next batch's."""
    return values.to("cpu", non_blocking=True, copy=True)


def to_device(values: list[int], device: torch.device) -> torch.Tensor:
    """Host integers as a device index; the copy is queued without waiting for the device's queued work."""
    return torch.tensor(values, dtype=torch.int64).to(device, non_blocking=True)
