"""A job's list of items through the service's batcher (service.engine.in_order): every result in the items' order,
never more than its window of tickets in the batcher, a failed batch raised once with the job's other tickets taken
out, and the batcher left serving."""

from __future__ import annotations

import threading

import pytest

from service.engine.batcher import Batcher, BatchPolicy
from service.engine.in_order import ItemsFailed, compute_in_order
from service.metrics import Metrics
from tests.service.engine.stand_ins import StandInEngine


class Item:
    def __init__(self, value: int, length: int):
        self.value, self.length = value, length

    def __len__(self) -> int:
        return self.length


class Doubling(StandInEngine):
    """Each item's result is twice its value; an item of value `fails_at` fails its batch."""

    def __init__(self, fails_at: int | None = None):
        self.fails_at = fails_at
        self.batches: list[list[int]] = []
        self.most_queued = 0
        self.batcher: Batcher | None = None
        self.lock = threading.Lock()

    def run(self, batch):
        with self.lock:
            self.batches.append([i.value for i in batch.items])
            self.most_queued = max(self.most_queued, self.batcher.queue_depth)
        if any(i.value == self.fails_at for i in batch.items):
            raise RuntimeError("this batch fails")
        return [2 * i.value for i in batch.items]

    def launch(self, batch):
        return self.run(batch)

    def finish(self, work):
        return work


def started(engine: Doubling, runners: int = 2) -> Batcher:
    batcher = Batcher(engine, BatchPolicy(max_batch_tokens=64, max_batch_size=4, max_queue_items=1000,
                                          runners=runners), Metrics())
    engine.batcher = batcher
    batcher.start()
    return batcher


def test_every_result_comes_back_in_the_items_order_within_the_window():
    engine = Doubling()
    batcher = started(engine)
    items = [Item(k, 1 + (k * 7) % 13) for k in range(203)]
    heard = []
    try:
        results = compute_in_order(batcher, items, window=3, on_returned=heard.append)
    finally:
        batcher.stop()
    assert results == [2 * k for k in range(203)]
    assert sorted(i.value for done in heard for i in done) == list(range(203))  # each item heard of once
    assert sorted(v for batch in engine.batches for v in batch) == list(range(203))  # each computed once
    assert engine.most_queued <= 3 * 4  # three tickets of one batch's size at most
    assert max(len(b) for b in engine.batches) <= 4


def test_a_failed_batch_is_raised_and_the_batcher_serves_on():
    engine = Doubling(fails_at=37)
    batcher = started(engine)
    try:
        with pytest.raises(ItemsFailed, match="internal"):
            compute_in_order(batcher, [Item(k, 3) for k in range(100)], window=2)
        engine.fails_at = None
        assert compute_in_order(batcher, [Item(k, 3) for k in range(10)]) == [2 * k for k in range(10)]
    finally:
        batcher.stop()


def test_no_items_no_tickets():
    engine = Doubling()
    batcher = started(engine, runners=1)
    try:
        assert compute_in_order(batcher, []) == [] and engine.batches == []
    finally:
        batcher.stop()
