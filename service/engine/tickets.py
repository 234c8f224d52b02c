"""What the batcher keeps of a request: its `Ticket` (deadline, results, where they go), one `Entry` per input
in the queue, and a `LaunchedBatch` on an asynchronous device."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Protocol

from service import tracing
from service.errors import ServiceError

if TYPE_CHECKING:
    from service.engine.batch_types import PreparedBatch

log = logging.getLogger("service")
_TICKET = attrgetter("ticket")


class Sink(Protocol):
    """Where finished requests go: called from a batcher thread, once per batch, with the requests it finished."""

    def deliver(self, tickets: list[Ticket]) -> None: ...


@dataclass(eq=False)  # one request: equal to itself alone, and hashable, so a batch's requests are found in C
class Ticket:
    """One request: its deadline, whether its client left, and its results as its inputs finish (in input
    order). It is finished when every input has a result, or at its first error (the rest is then not
    computed); the batcher hands it to its `sink` then, once."""

    deadline: float  # time.monotonic() by which the entries must reach the device
    size: int  # how many inputs
    sink: Sink
    tag: Any = None  # the sink's own reference to the request (a future, a request id)
    cancelled: bool = False  # set by the caller when its client goes away
    error: ServiceError | None = None
    trace: str | None = None  # the request's W3C traceparent when it is traced (its batches' spans link to it)
    # Turns the inputs' results into the request's once all are in (service.engine.long_inputs.folder: the windows of
    # a long input folded into one vector); None keeps them as they are.
    finish: Callable[[list], list] | None = None
    results: list = field(init=False)
    missing: int = field(init=False)
    # Where its time went, noted as its batches finish (`note_batch`, below):
    started: float = field(init=False, default=0.0)  # time.monotonic() when its first batch began; 0: none yet
    inference_s: float = field(init=False, default=0.0)  # device time of its batches, each counted once
    batch_spans: list | None = field(init=False, default=None)  # its batches' traceparents (traced requests only)

    def __post_init__(self) -> None:
        self.results = [None] * self.size
        self.missing = self.size

    def record(self, index: int, result, error: ServiceError | None) -> bool:
        """One input's outcome; True when it finished the request."""
        if self.missing == 0:
            return False  # finished already (by an earlier error)
        if error is not None:
            self.error, self.missing, self.cancelled = error, 0, True
            return True
        self.results[index] = result
        self.missing -= 1
        if self.missing == 0 and self.finish is not None:
            self.results = self.finish(self.results)
        return self.missing == 0


@dataclass
class LaunchedBatch:
    """A batch launched on an asynchronous device whose results the runner has not read yet."""

    entries: list[Entry]
    batch: PreparedBatch
    work: Any  # the engine's handle on the batch's queued device work, for finish
    started: float  # time.perf_counter() at launch
    queue: Any = None  # the model's Batcher it came from, which finishes it


class Entry:
    """One input of a request in its model's queue. Compared by identity: equal items of two requests are two entries.
    A plain class with slots, not a dataclass: the engine makes one per input on the thread that reads the front ends'
    requests, and this makes it in three fifths of the time."""

    __slots__ = ("item", "ticket", "index", "enqueued_at", "length", "arrival")

    def __init__(self, item: Any, ticket: Ticket, index: int, enqueued_at: float | None = None):
        self.item = item  # anything with len() = its tokens
        self.ticket = ticket
        self.index = index  # the input's place in its request
        self.enqueued_at = time.monotonic() if enqueued_at is None else enqueued_at
        self.length = len(item)  # tokens; read many times while the entry waits
        # `arrival`: its place in its model's queue, set as it joins it (service.engine.model_queue)

    def __repr__(self) -> str:
        return f"Entry({self.length} tokens, input {self.index} of {self.ticket.tag!r})"


def note_batch(entries: list[Entry], batch: PreparedBatch, seconds: float, metrics, lock) -> None:
    """A batch computed in `seconds`: its metrics; in each of its requests' tickets, when its first batch began and
    the device time of its batches; and, when this process traces (service.tracing.current()) and a request in it is
    traced, one span for the batch, linked to each traced request, whose traceparent each of them keeps. Called
    before any of these tickets is handed back; `lock` (the batcher's results lock) is held while they are written,
    since another runner may be noting a batch of the same request."""
    metrics.observe_batch(seconds, batch)
    began = time.monotonic() - seconds
    tickets = dict.fromkeys(map(_TICKET, entries))  # each request once, in order
    traced = [t.trace for t in tickets if t.trace is not None]
    span, spans = None, tracing.current() if traced else None
    if spans is not None:
        try:
            span = spans.batch(traced, began, seconds, batch)
        except Exception:  # noqa: BLE001 - a trace that cannot be recorded costs the batch nothing
            log.exception("could not record the span of a batch")
    with lock:
        for ticket in tickets:
            if not ticket.started or began < ticket.started:
                ticket.started = began
            ticket.inference_s += seconds
            if span is not None and ticket.trace is not None:
                ticket.batch_spans = [*(ticket.batch_spans or ()), span]
