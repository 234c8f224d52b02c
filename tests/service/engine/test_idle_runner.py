"""An idle runner picks a new request's batch itself (one thread hop instead of two: service.engine.batcher), and
that shortcut keeps every rule the preparer keeps: deadlines, cancellation, oldest first, batching under load."""

from __future__ import annotations

import re
import threading
import time

from service.engine.batcher import Batcher, BatchPolicy, Ticket
from service.metrics import Metrics
from tests.service.engine.test_overlapped_batches import Collected, FakeBatch


class HostEngine:
    """A CPU-like engine (run, no overlap): an item's answer is its sum. Records which thread collated and ran each
    batch and what was in it; `gate`, when set, holds every run until it opens."""

    overlaps = False
    pads_attention = False

    def __init__(self):
        self.collated_on: list[str] = []
        self.batches: list[list[int]] = []
        self.gate: threading.Event | None = None
        self.running = threading.Event()
        self.entered = 0  # runs started

    def collate(self, items):
        self.collated_on.append(threading.current_thread().name)
        return FakeBatch(items)

    def run(self, batch: FakeBatch) -> list[int]:
        self.entered += 1
        self.running.set()
        if self.gate is not None:
            assert self.gate.wait(10)
        self.batches.append([sum(i) for i in batch.items])
        return [sum(i) for i in batch.items]

    def flops(self, *args):
        return 1.0, 0.0

    def release_cached_memory(self) -> None:
        pass

    def is_out_of_memory(self, exc: BaseException) -> bool:
        return False


def started(engine: HostEngine, runners: int = 1, max_wait_s: float = 0.0, max_batch_size: int = 64) -> Batcher:
    batcher = Batcher(engine, BatchPolicy(max_batch_tokens=10_000, max_batch_size=max_batch_size, max_wait_s=max_wait_s,
                                          runners=runners), Metrics())
    batcher.start()
    runners_idle(batcher)
    return batcher


def runners_idle(batcher: Batcher) -> None:
    """Wait until every runner is back at its wait, with nothing on the device (as after a pause between requests)."""
    deadline = time.monotonic() + 5
    while batcher.device.idle_runners < batcher.device.runners and time.monotonic() < deadline:
        time.sleep(0.001)
    assert batcher.device.idle_runners == batcher.device.runners, "the runners never went idle"


def gated(**caps) -> tuple[HostEngine, Collected, Batcher]:
    """A started batcher over a HostEngine whose runs wait at its gate (closed) until the test opens it."""
    engine, sink = HostEngine(), Collected()
    engine.gate = threading.Event()
    return engine, sink, started(engine, **caps)


def ask(batcher: Batcher, sink: Collected, items, deadline_s: float = 30.0) -> Ticket:
    ticket = Ticket(time.monotonic() + deadline_s, len(items), sink, tag=items)
    batcher.submit(items, ticket)
    return ticket


def answered(sink: Collected, count: int) -> None:
    """Wait until `count` requests in all have reached the sink."""
    deadline = time.monotonic() + 10
    while len(sink.tickets) < count and time.monotonic() < deadline:
        time.sleep(0.001)
    assert len(sink.tickets) >= count, f"{len(sink.tickets)} of {count} answered"


def test_a_request_to_an_idle_batcher_is_collated_by_the_runner_not_the_preparer():
    engine, sink = HostEngine(), Collected()
    batcher = started(engine, runners=2)
    try:
        for n in range(5):  # one at a time, as one client sends them
            runners_idle(batcher)  # the last answer may reach the client before its runner is back at its wait
            ticket = ask(batcher, sink, [[n, 1]])
            answered(sink, n + 1)
            assert ticket.results == [n + 1]
        assert all(name.startswith("bert-runner-") for name in engine.collated_on), engine.collated_on
    finally:
        batcher.stop()


def test_the_preparer_alone_picks_when_batches_may_wait_for_company():
    engine, sink = HostEngine(), Collected()
    batcher = started(engine, max_wait_s=0.001)
    try:
        ask(batcher, sink, [[1]])
        answered(sink, 1)
        assert engine.collated_on == ["bert-preparer"]
    finally:
        batcher.stop()


def test_an_input_past_its_deadline_is_not_computed_on_the_idle_path():
    engine, sink = HostEngine(), Collected()
    batcher = started(engine)
    try:
        late = ask(batcher, sink, [[7]], deadline_s=-1.0)
        answered(sink, 1)
        assert late.error is not None and late.error.kind == "unavailable" and "deadline" in late.error.message
        assert engine.batches == []
        on_time = ask(batcher, sink, [[8]])
        answered(sink, 2)
        assert on_time.results == [8]
    finally:
        batcher.stop()


def test_every_input_of_a_request_past_its_deadline_is_counted_as_dropped_for_its_deadline():
    """Answering a request's first late input fails the request (and so cancels it): its other inputs were still
    late, not disconnected, when they were found."""
    engine, sink, metrics = HostEngine(), Collected(), Metrics()
    batcher = Batcher(engine, BatchPolicy(max_batch_tokens=10_000, max_batch_size=64), metrics)
    batcher.start()
    try:
        late = ask(batcher, sink, [[1], [2], [3]], deadline_s=-1.0)
        answered(sink, 1)
        assert late.error is not None and "deadline" in late.error.message and engine.batches == []
        dropped = re.findall(r'^bert_items_dropped_total\{model="",reason="(\w+)"\} (\S+)$', metrics.render().decode(),
                             re.M)
        assert [(reason, float(count)) for reason, count in dropped if float(count)] == [("deadline", 3.0)]
    finally:
        batcher.stop()


def test_a_cancelled_request_is_not_computed_on_the_idle_path():
    engine, sink = HostEngine(), Collected()
    batcher = started(engine)
    try:
        gone = Ticket(time.monotonic() + 30, 1, sink, tag="gone")
        batcher.cancel(gone)  # its client left before the runner picked it
        batcher.submit([[5]], gone)
        answered(sink, 1)
        assert gone.error is not None and "disconnected" in gone.error.message
        assert engine.batches == []
    finally:
        batcher.stop()


def test_while_the_idle_runner_computes_the_queue_builds_batches_oldest_first():
    engine, sink, batcher = gated()
    try:
        first = ask(batcher, sink, [[100]])
        assert engine.running.wait(5)  # the runner took it alone and is computing it
        later = [ask(batcher, sink, [[n]]) for n in range(1, 6)]
        engine.gate.set()
        answered(sink, 6)
        assert first.results == [100] and [t.results for t in later] == [[n] for n in range(1, 6)]
        assert engine.batches[0] == [100]
        # the five that queued meanwhile went out together (the preparer prepared them while the runner was busy)
        assert sorted(x for batch in engine.batches[1:] for x in batch) == [1, 2, 3, 4, 5]
        assert len(engine.batches) == 2, engine.batches
    finally:
        batcher.stop()


def test_while_a_batch_computes_a_new_request_goes_through_the_preparer():
    engine, sink, batcher = gated(runners=2)
    try:
        ask(batcher, sink, [[1]])
        assert engine.running.wait(5)
        ask(batcher, sink, [[2]])  # one runner is busy: under load the preparer picks, so batches gather company
        deadline = time.monotonic() + 5
        while len(engine.collated_on) < 2 and time.monotonic() < deadline:
            time.sleep(0.001)  # picked and collated while the first batch is still held
        engine.gate.set()
        answered(sink, 2)
        assert engine.collated_on[0].startswith("bert-runner-") and engine.collated_on[1] == "bert-preparer"
    finally:
        engine.gate.set()
        batcher.stop()


def test_what_an_idle_runner_leaves_over_the_cap_goes_to_the_other_runner_at_once():
    engine, sink, batcher = gated(runners=2, max_batch_size=2)
    try:
        ticket = ask(batcher, sink, [[n] for n in range(4)])  # two batches' worth, to an idle batcher
        deadline = time.monotonic() + 5
        while engine.entered < 2 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert engine.entered == 2  # both runners compute while the first batch is still held
        engine.gate.set()
        answered(sink, 1)
        assert ticket.results == [0, 1, 2, 3]
    finally:
        engine.gate.set()
        batcher.stop()


def test_stopping_answers_what_is_queued():
    engine, sink, batcher = gated(runners=2)
    tickets = [ask(batcher, sink, [[n]]) for n in range(20)]
    engine.gate.set()
    batcher.stop()
    answered(sink, 20)
    assert [t.results for t in tickets] == [[n] for n in range(20)]


def test_clients_coming_and_going_each_get_their_own_answers_once():
    """A few clients at a time (the batcher idle, then busy, then idle), some leaving early: every request is
    answered exactly once, with its own inputs' results or as disconnected."""
    import random

    engine, sink = HostEngine(), Collected()
    batcher = started(engine, runners=2, max_batch_size=3)
    tickets: list[tuple[Ticket, list]] = []
    lock = threading.Lock()

    def client(seed: int) -> None:
        chance = random.Random(seed)
        for n in range(60):
            items = [[seed, n, k] for k in range(chance.randint(1, 4))]
            ticket = Ticket(time.monotonic() + 30, len(items), sink, tag=items)
            if chance.random() < 0.1:
                batcher.cancel(ticket)
            with lock:
                tickets.append((ticket, items))
            batcher.submit(items, ticket)
            time.sleep(chance.random() * 0.002)

    try:
        threads = [threading.Thread(target=client, args=(seed,)) for seed in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        answered(sink, len(tickets))
        time.sleep(0.05)
        assert len(sink.tickets) == len(tickets)  # none answered twice
        for ticket, items in tickets:
            if ticket.error is None:
                assert ticket.results == [sum(i) for i in items]
            else:
                assert "disconnected" in ticket.error.message
    finally:
        batcher.stop()
