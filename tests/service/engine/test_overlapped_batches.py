"""The runner on an asynchronous device (a GPU): it launches the next batch before it finishes the last one, so
the device computes one while the host builds the other's replies. Checked with an engine whose device is a
thread: every request gets its own answers, launches run ahead of finishes when batches queue, a lone batch is
finished without waiting for company, failures stay with their batch, and stopping loses nothing."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from service.engine.batcher import Batcher, BatchPolicy, Ticket
from service.errors import ServiceError
from service.metrics import Metrics


@dataclass
class FakeBatch:
    items: list
    flops: float = 1.0
    padding_flops: float = 0.0

    @property
    def size(self) -> int:
        return len(self.items)

    @property
    def real_tokens(self) -> int:
        return sum(len(i) for i in self.items)

    padded_tokens = real_tokens


class DeviceEngine:
    """Items are lists of ints; the answer of an item is its sum. `launch` hands the work to a one-thread
    "device" that takes `device_s` a batch, and returns at once; `finish` waits for it."""

    overlaps = True
    pads_attention = False

    def __init__(self, device_s: float = 0.005, fail_launch_above: int | None = None, fail_finish_with: int | None = None):
        self.device = ThreadPoolExecutor(1)
        self.device_s = device_s
        self.fail_launch_above = fail_launch_above  # out of memory for batches bigger than this
        self.fail_finish_with = fail_finish_with  # a device error for the batch holding an item of this sum
        self.log: list[tuple[str, int]] = []
        self.lock = threading.Lock()
        self.launches = 0

    def collate(self, items):
        return FakeBatch(items)

    def launch(self, batch: FakeBatch) -> tuple[int, Future]:
        if self.fail_launch_above is not None and batch.size > self.fail_launch_above:
            raise RuntimeError("CUDA out of memory (simulated)")
        with self.lock:
            self.launches += 1
            number = self.launches
            self.log.append(("launch", number))
        return number, self.device.submit(self._compute, batch)

    def _compute(self, batch: FakeBatch) -> list[int]:
        time.sleep(self.device_s)
        if self.fail_finish_with is not None and any(sum(i) == self.fail_finish_with for i in batch.items):
            raise RuntimeError("device-side assert (simulated)")
        return [sum(i) for i in batch.items]

    def finish(self, launched) -> list[int]:
        number, future = launched
        with self.lock:
            self.log.append(("finish", number))
        return future.result()

    def run(self, batch):
        return self.finish(self.launch(batch))

    def flops(self, *args):
        return 1.0, 0.0

    def release_cached_memory(self) -> None:
        pass

    def is_out_of_memory(self, exc: BaseException) -> bool:
        return "out of memory" in str(exc)


class Collected:
    """A sink that keeps each finished ticket."""

    def __init__(self):
        self.tickets: list[Ticket] = []
        self.all_in = threading.Event()
        self.expected = 0

    def deliver(self, tickets: list[Ticket]) -> None:
        self.tickets.extend(tickets)
        if len(self.tickets) >= self.expected:
            self.all_in.set()


def serve(engine: DeviceEngine, requests: list[list[list[int]]], max_batch_size: int = 4) -> Collected:
    """All `requests` queued, then the batcher started: batches are there to launch ahead from the first one."""
    sink = Collected()
    sink.expected = len(requests)
    batcher = Batcher(engine, BatchPolicy(max_batch_tokens=10_000, max_batch_size=max_batch_size), Metrics())
    for items in requests:
        batcher.submit(items, Ticket(time.monotonic() + 30, len(items), sink, tag=items))
    batcher.start()
    try:
        assert sink.all_in.wait(10), f"{len(sink.tickets)} of {len(requests)} requests answered"
    finally:
        batcher.stop()
    return sink


def test_every_request_gets_its_own_answers_and_launches_run_ahead():
    engine = DeviceEngine()
    requests = [[[n, k] for k in range(1 + n % 3)] for n in range(40)]
    sink = serve(engine, requests)
    assert len(sink.tickets) == len(requests)
    for ticket in sink.tickets:
        assert ticket.error is None and ticket.results == [sum(i) for i in ticket.tag]
    launches = [n for kind, n in engine.log if kind == "launch"]
    finishes = [n for kind, n in engine.log if kind == "finish"]
    assert launches == finishes == sorted(launches)  # each batch finished once, in launch order
    # With batches queued, batch k+1 was launched before batch k was finished (most of the time: the preparer collates
    # the next batch while the runner launches this one, and the runner waits a moment for it)
    ahead = sum(engine.log.index(("launch", k + 1)) < engine.log.index(("finish", k)) for k in launches[:-1])
    assert ahead >= len(launches) // 2, engine.log


def test_a_lone_batch_is_finished_without_waiting_for_another():
    engine = DeviceEngine(device_s=0.001)
    started = time.monotonic()
    sink = serve(engine, [[[1, 2, 3]]])
    assert sink.tickets[0].results == [6] and time.monotonic() - started < 5
    assert engine.log == [("launch", 1), ("finish", 1)]


def test_out_of_memory_at_launch_splits_the_batch():
    engine = DeviceEngine(fail_launch_above=1)
    requests = [[[n], [n, 1]] for n in range(6)]
    sink = serve(engine, requests)
    assert all(t.error is None and t.results == [sum(i) for i in t.tag] for t in sink.tickets)


def test_a_device_error_at_finish_fails_only_its_batch():
    engine = DeviceEngine(fail_finish_with=1000)
    requests = [[[n]] for n in range(8)] + [[[1000]]] + [[[n]] for n in range(8, 16)]
    sink = serve(engine, requests, max_batch_size=1)
    failed = [t for t in sink.tickets if t.error is not None]
    assert [t.tag for t in failed] == [[[1000]]]
    assert isinstance(failed[0].error, ServiceError) and failed[0].error.kind == "internal"
    assert sum(t.error is None for t in sink.tickets) == 16


@pytest.mark.parametrize("device_s", [0.0, 0.02])
def test_stopping_answers_everything_queued(device_s):
    engine = DeviceEngine(device_s=device_s)
    sink = Collected()
    batcher = Batcher(engine, BatchPolicy(max_batch_tokens=10_000, max_batch_size=2), Metrics())
    batcher.start()
    for n in range(20):
        batcher.submit([[n]], Ticket(time.monotonic() + 30, 1, sink, tag=n))
    batcher.stop()
    assert sorted(t.tag for t in sink.tickets) == list(range(20))
    assert all(t.results == [t.tag] for t in sink.tickets)
    assert not any(thread.is_alive() for thread in [batcher._preparer, *batcher.device._threads])
