"""The device stream an express runner queues its batches on (service.engine.device_runners).

On a GPU the runner queues every batch on the device's default stream, in order: a batch launched there starts
only when the batches before it on that stream have ended. A request that wakes an idle model (a reranker's query
beside a flooded embedder) would wait there for the flood's batch in flight and the one launched behind it. Its
express runner queues it on a stream of its own instead, at the device's highest priority: its kernels start at
once beside the flood's, and as the flood's thread blocks retire the block scheduler gives the freed
multiprocessors to the high-priority stream's blocks first (CUDA Programming Guide, "Stream Priorities"). A CUDA
graph replayed there takes the stream's priority. Separate servers get the same concurrency only by time-slicing
two contexts.

Elsewhere (a CPU) the operating system's threads already run side by side: nothing to enter.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from functools import partial

import torch

# Lower numbers are higher priorities; torch maps a number past the device's range to its nearest end, so this is
# the highest the device has (-5 on recent NVIDIA GPUs; torch.cuda.Stream's own docs).
HIGHEST_PRIORITY = -(1 << 10)


def _own_stream(device: torch.device) -> AbstractContextManager:
    return torch.cuda.stream(torch.cuda.Stream(device, priority=HIGHEST_PRIORITY))


def express_stream(device: torch.device) -> Callable[[], AbstractContextManager]:
    """What each express runner of `device` enters for its whole life (the current stream is per thread in torch):
    on a GPU a new high-priority stream; elsewhere nothing."""
    return partial(_own_stream, device) if device.type == "cuda" else nullcontext
