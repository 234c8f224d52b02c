"""What the batcher asks of a batch, of an engine, and of its settings: plain types that the batcher, the batch
choice and the tickets share, so that none of those modules needs another's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


class PreparedBatch(Protocol):
    size: int
    real_tokens: int
    padded_tokens: int
    flops: float
    padding_flops: float


class BatchEngine(Protocol):
    """What the batcher needs of an engine."""

    def collate(self, items: list[Any]) -> PreparedBatch: ...
    def run(self, batch: PreparedBatch) -> list[Any]: ...
    overlaps: bool  # True: launch returns while the device still computes (then launch + finish, else run)
    def launch(self, batch: PreparedBatch) -> Any: ...
    def finish(self, work: Any) -> list[Any]: ...
    def flops(self, count: int, longest: int, real: int, real_squares: int) -> tuple[float, float]: ...
    pads_attention: bool  # False: any mix of lengths costs no padding (then batches are not priced)
    def release_cached_memory(self) -> None: ...
    def is_out_of_memory(self, exc: BaseException) -> bool: ...


@dataclass(frozen=True)
class BatchPolicy:
    """How batches are formed and how much may wait (see the Settings fields of the same names)."""

    max_batch_tokens: int
    max_batch_size: int
    max_wait_s: float = 0.0
    max_queue_items: int = 4096
    max_padding_fraction: float = 1.0
    runners: int = 1  # batches computed at once
    runner_niceness: int = 0
