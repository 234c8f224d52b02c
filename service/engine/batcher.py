"""Dynamic batching. Knows nothing of HTTP, nor which model runs; decides *when* and *what* runs together.

Every input of every request is one entry in one queue. Threads serve it:
- the preparer picks the next batch (`choose_batch`: anchored on the oldest entry, filled with entries
  of similar length under the token budget, so padding stays small) and collates it while the device
  is busy with the current one: one batch is always ready ahead;
- one runner per concurrent batch (one on a GPU; two on a CPU, each on half the cores) feeds
  prepared batches to the engine and records each item's result in its request's `Ticket`; the
  requests a batch finishes go to their `Sink` together (an event loop in this process, or the engine
  process's socket back to a front end). Where the engine's device runs asynchronously (a GPU), the
  runner launches the next batch before it reads the last one's results: the device computes one
  while the host turns the other into replies.
Entries whose client went away are dropped before compute, entries past their deadline get
`unavailable`, and a batch that runs out of device memory is split in two and retried.

An idle batcher (nothing computing, prepared or being collated: one client, a few) has a runner pick and collate
a new request's batch itself, as the preparer would: one thread hand-over to the compute instead of two (submitter ->
preparer -> runner). Under load the preparer alone picks (its wake-up lets a batch gather company; at 16 clients x 8 a
runner picking at once made smaller batches, 0.94x the sentences/s), and with max_wait_s above 0.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

from service.engine.batch_choice import choose_batch, pricing
from service.engine.batch_types import BatchEngine, BatchPolicy, PreparedBatch
from service.engine.tickets import Entry, LaunchedBatch, Sink, Ticket
from service.errors import ServiceError
from service.metrics import Metrics
from service.engine.threads import lower_thread_priority, name_os_thread

log = logging.getLogger("service")
# With a batch in flight on the device, how long the runner waits for the preparer's next batch before it reads the
# one in flight instead: long enough for a collation (tens to hundreds of us), short next to a batch on the device.
AHEAD_WAIT_S = 0.002


class Batcher:
    def __init__(self, engine: BatchEngine, policy: BatchPolicy, metrics: Metrics):
        self.engine = engine
        self.policy = policy
        self.metrics = metrics
        self._queue: deque[Entry] = deque()
        # What the preparer keeps of the queue, so that a wake-up costs nothing per entry: its tokens, the
        # earliest deadline in it, and whether a request was cancelled since the last look at every entry.
        self._queued_tokens = 0
        self._earliest_deadline = float("inf")
        self._cancelled_since_scan = False
        # One lock, two conditions: a new request wakes the preparer only, a prepared batch the runners only
        # (each wake-up of a thread that goes back to sleep costs a GIL hand-over).
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)  # the preparer waits on it
        self._batch_ready = threading.Condition(self._lock)  # the runners wait on it
        self._prepared: tuple[list[Entry], PreparedBatch] | None = None  # the one batch ready ahead
        self._running = 0  # batches taken by runners and not yet answered (on a GPU, up to two a runner)
        self._stopping = False
        self._preparer_finished = False  # set by the preparer once stopping and the queue is empty
        self._collating = False  # the preparer has chosen a batch and is collating it
        self._idle_runners = 0  # runners waiting for a batch with none on the device: a new request may go to one
        self._threads: list[threading.Thread] = []
        self._results_lock = threading.Lock()  # runners finish entries of one request concurrently
        self._recent_batch_s = 0.05  # for Retry-After: how fast the queue drains
        self._progress_at = time.monotonic()  # when a taken batch was last done with, or work came to an idle one

    # ---- life cycle ----------------------------------------------------------------------------

    def start(self) -> None:
        workers = [(self._prepare_loop, "bert-preparer")] + [(self._run_loop, f"bert-runner-{n}")
                                                         for n in range(self.policy.runners)]
        for target, name in workers:
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float = 60.0) -> None:
        """Finish everything already queued, then stop the threads."""
        with self._lock:
            self._stopping = True
            self._cond.notify_all()
            self._batch_ready.notify_all()
        for thread in self._threads:
            thread.join(timeout)

    @property
    def workers_alive(self) -> bool:
        """Whether every packing and compute thread is still running (liveness: a dead one never comes back)."""
        return all(thread.is_alive() for thread in self._threads)

    def stalled_for(self) -> float:
        """Seconds the batcher has had work (queued, being prepared or computed) without finishing a batch; 0 while
        idle. A hung device, a deadlocked thread or a stopped process shows here (the engine's heartbeat)."""
        busy = self._queue or self._running or self._prepared is not None or self._collating
        return max(0.0, time.monotonic() - self._progress_at) if busy else 0.0

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    # ---- submission (any thread) ----------------------------------------------------------------

    def submit(self, items: list, ticket: Ticket) -> None:
        """Queue a request's items; its ticket reaches its sink when all are computed (or one fails)."""
        with self._lock:
            if self._stopping:
                raise ServiceError("unavailable", "the server is shutting down")
            if len(self._queue) + len(items) > self.policy.max_queue_items:
                wait = self._recent_batch_s * max(1, len(self._queue) / max(1, self.policy.max_batch_size))
                raise ServiceError("overloaded", f"the queue is full ({len(self._queue)} inputs waiting); retry later",
                                   retry_after_s=wait)
            now = time.monotonic()
            if not (self._queue or self._running or self._prepared is not None or self._collating):
                self._progress_at = now  # an idle batcher's clock starts with its work
            entries = [Entry(item, ticket, index, now) for index, item in enumerate(items)]
            self._queue.extend(entries)
            self._queued_tokens += sum(e.length for e in entries)
            sooner = ticket.deadline < self._earliest_deadline
            self._earliest_deadline = min(self._earliest_deadline, ticket.deadline)
            self.metrics.queue_depth.set(len(self._queue))
            # An idle runner picks it itself (module docstring); with a batch prepared the preparer waits for a runner.
            if self._runner_may_pack():
                self._batch_ready.notify()
            elif self._prepared is None or sooner:
                self._cond.notify()

    def cancel(self, ticket: Ticket) -> None:
        """The request's client went away: its entries that have not run are dropped (any thread)."""
        ticket.cancelled = True
        self._cancelled_since_scan = True

    # ---- preparing (preparer thread) -------------------------------------------------------------

    def _prepare_loop(self) -> None:
        name_os_thread()
        while True:
            with self._lock:
                chosen = self._wait_and_select()
                if chosen is None:
                    self._preparer_finished = True
                    self._batch_ready.notify_all()
                    return
                self._collating = True
            try:
                batch = self.engine.collate([e.item for e in chosen])
            except Exception:  # noqa: BLE001 - a bad batch fails its own entries only
                log.exception("collate failed")
                with self._lock:
                    self._collating = False
                self._fail(chosen, ServiceError("internal", "internal error while preparing the batch"))
                continue
            with self._lock:
                self._prepared, self._collating = (chosen, batch), False
                self._batch_ready.notify()

    def _wait_and_select(self) -> list[Entry] | None:
        """Under the lock: wait until there is something to run and nowhere for it to wait, then pick it."""
        policy = self.policy
        while True:
            self._drop_dead_entries()
            if self._stopping and not self._queue:
                return None
            if self._prepared is None and self._queue:
                idle = self._running < policy.runners
                short = self._queued_tokens < policy.max_batch_tokens // 2 and \
                    len(self._queue) < policy.max_batch_size
                waited = time.monotonic() - self._queue[0].enqueued_at
                # Wait for company only when the device would otherwise sit idle with a small batch.
                if not (idle and short and waited < policy.max_wait_s and not self._stopping):
                    return self._take(choose_batch(self._queue, policy, pricing(self.engine)))
                self._cond.wait(policy.max_wait_s - waited)
                continue
            self._cond.wait(self._next_deadline_in())

    def _take(self, chosen: list[Entry]) -> list[Entry]:
        chosen_ids = {id(e) for e in chosen}
        self._queue = deque(e for e in self._queue if id(e) not in chosen_ids)
        self._queued_tokens -= sum(e.length for e in chosen)
        # _earliest_deadline stays a lower bound: at worst one needless look through the queue sets it exactly. An
        # empty queue has none, so that the next entry counts as sooner and wakes the preparer: with a batch prepared,
        # the preparer sleeps without a timeout over an empty queue, and (were its runner stuck) would never drop
        # that entry at its deadline.
        if not self._queue:
            self._earliest_deadline = float("inf")
        self.metrics.queue_depth.set(len(self._queue))
        return chosen

    def _set_queue(self, queue: deque[Entry]) -> None:
        self._queue = queue
        self._queued_tokens = sum(e.length for e in queue)
        self._earliest_deadline = min((e.ticket.deadline for e in queue), default=float("inf"))
        self.metrics.queue_depth.set(len(queue))

    def _next_deadline_in(self) -> float | None:
        if not self._queue:
            return None
        return max(0.001, self._earliest_deadline - time.monotonic())

    def _drop_dead_entries(self) -> None:
        """Answer the entries past their deadline or whose client left. The queue is only read through when
        one may be there: the earliest deadline has passed, or a request was cancelled or failed."""
        now = time.monotonic()
        if not self._queue or (now <= self._earliest_deadline and not self._cancelled_since_scan):
            return
        self._cancelled_since_scan = False
        alive: deque[Entry] = deque()
        for entry in self._queue:
            if entry.ticket.cancelled:
                self._drop(entry, "disconnected", ServiceError("unavailable", "client disconnected"))
            elif now > entry.ticket.deadline:
                self._drop(entry, "deadline", ServiceError(
                    "unavailable", "the request waited in the queue past its deadline", retry_after_s=1))
            else:
                alive.append(entry)
        self._set_queue(alive)

    # ---- running (runner threads) --------------------------------------------------------------

    def _run_loop(self) -> None:
        name_os_thread()
        lower_thread_priority(self.policy.runner_niceness)
        on_device: LaunchedBatch | None = None
        while True:
            taken = self._take_prepared(on_device is not None)
            if taken is None and on_device is None:
                return
            if taken is not None and taken[1] is None:  # picked by this runner (idle): collated here
                taken = self._collate_own(taken[0])
                if taken is None:
                    continue
            if not self.engine.overlaps:
                try:
                    self._run_batch(*taken)
                finally:
                    self._release()
                continue
            # The next batch goes to the device before the last one's results are read: with nothing prepared, the
            # one in flight is finished at once (no batch waits for company that may not come).
            launched = self._launch(*taken) if taken is not None else None
            if taken is not None and launched is None:
                self._release()  # dropped, or failed (and answered) at launch
            if on_device is not None:
                try:
                    self._finish(on_device)
                finally:
                    self._release()
            on_device = launched

    def _runner_may_pack(self) -> bool:
        """Under the lock: whether an idle runner picks the next batch itself (the batcher idle: module docstring)."""
        return bool(self._idle_runners and self._queue and not self._running and self._prepared is None
                    and not self._collating and self.policy.max_wait_s == 0)

    def _take_prepared(self, one_on_device: bool) -> tuple[list[Entry], PreparedBatch | None] | None:
        """The prepared batch: waited for until the preparer has finished, or with a batch in flight, None at once
        unless the preparer is about to prepare one (entries queued, or being collated); then up to AHEAD_WAIT_S.
        With none on the device and the preparer idle, the entries of the next batch, picked here, and None for
        their batch: the runner collates them itself."""
        with self._lock:
            if not one_on_device:
                self._idle_runners += 1
                try:
                    while self._prepared is None and not self._preparer_finished:
                        if self._runner_may_pack():
                            self._drop_dead_entries()
                            if self._queue:
                                self._running += 1
                                chosen = self._take(choose_batch(self._queue, self.policy, pricing(self.engine)))
                                self._cond.notify()  # what did not fit, if any: the preparer prepares it
                                return chosen, None
                            continue
                        self._batch_ready.wait()
                finally:
                    self._idle_runners -= 1
            elif self._prepared is None and (self._queue or self._collating):
                self._batch_ready.wait(AHEAD_WAIT_S)
            taken, self._prepared = self._prepared, None
            if taken is not None:
                self._running += 1
                self._cond.notify()  # the preparer may prepare the next batch now
            return taken

    def _collate_own(self, chosen: list[Entry]) -> tuple[list[Entry], PreparedBatch] | None:
        """Collate a batch this runner picked itself; None (its entries failed, the batch released) if that fails."""
        try:
            return chosen, self.engine.collate([e.item for e in chosen])
        except Exception:  # noqa: BLE001 - a bad batch fails its own entries only
            log.exception("collate failed")
            self._fail(chosen, ServiceError("internal", "internal error while preparing the batch"))
            self._release()
            return None

    def _release(self) -> None:
        """A taken batch is done with (answered, failed or dropped)."""
        with self._lock:
            self._running -= 1
            self._progress_at = time.monotonic()
            self._cond.notify()

    def _alive(self, chosen: list[Entry], batch: PreparedBatch) -> tuple[list[Entry], PreparedBatch | None]:
        """The entries still wanted (those whose client left while the batch waited are answered and not computed;
        the rest is collated again), each one's time in the queue observed."""
        alive = [e for e in chosen if not e.ticket.cancelled]
        if len(alive) != len(chosen):
            for entry in chosen:
                if entry.ticket.cancelled:
                    self._drop(entry, "disconnected", ServiceError("unavailable", "client disconnected"))
            if not alive:
                return [], None
            batch = self.engine.collate([e.item for e in alive])
        now = time.monotonic()
        for entry in alive:
            self.metrics.queue_seconds.observe(now - entry.enqueued_at)
        return alive, batch

    def _run_batch(self, chosen: list[Entry], batch: PreparedBatch) -> None:
        alive, batch = self._alive(chosen, batch)
        if alive:
            self._run_splitting(alive, batch)

    def _run_splitting(self, entries: list[Entry], batch: PreparedBatch) -> None:
        started = time.perf_counter()
        try:
            results = self.engine.run(batch)
        except Exception as exc:  # noqa: BLE001 - failures fan out to this batch's entries only
            self._recover(entries, exc)
            return
        self._observe(started, batch)
        self._hand_back(entries, results)

    def _launch(self, chosen: list[Entry], batch: PreparedBatch) -> LaunchedBatch | None:
        alive, batch = self._alive(chosen, batch)
        if not alive:
            return None
        started = time.perf_counter()
        try:
            return LaunchedBatch(alive, batch, self.engine.launch(batch), started)
        except Exception as exc:  # noqa: BLE001 - as in _run_splitting (out of memory surfaces at launch)
            self._recover(alive, exc)
            return None

    def _finish(self, on_device: LaunchedBatch) -> None:
        try:
            results = self.engine.finish(on_device.work)
        except Exception:  # noqa: BLE001 - a device error found at the wait: this batch's entries fail
            log.exception("batch of %d failed", len(on_device.entries))
            self._fail(on_device.entries, ServiceError("internal", "internal error while computing the batch"))
            return
        self._observe(on_device.started, on_device.batch)
        self._hand_back(on_device.entries, results)

    def _recover(self, entries: list[Entry], exc: BaseException) -> None:
        """A batch failed on the device: out of memory splits it in two and runs the halves, else its entries fail."""
        out_of_memory = self.engine.is_out_of_memory(exc)
        if out_of_memory and len(entries) > 1:
            self.metrics.batch_splits.inc()
            log.warning("out of memory on a batch of %d; splitting it", len(entries))
            self.engine.release_cached_memory()
            half = len(entries) // 2
            for part in (entries[:half], entries[half:]):
                self._run_splitting(part, self.engine.collate([e.item for e in part]))
            return
        if out_of_memory:
            error = ServiceError("unavailable", "the input does not fit in device memory", retry_after_s=5)
        else:
            log.error("batch of %d failed", len(entries), exc_info=exc)
            error = ServiceError("internal", "internal error while computing the batch")
        self._fail(entries, error)

    def _observe(self, started: float, batch: PreparedBatch) -> None:
        elapsed = time.perf_counter() - started
        self._recent_batch_s = 0.8 * self._recent_batch_s + 0.2 * elapsed
        self.metrics.observe_batch(elapsed, batch)

    def _fail(self, entries: list[Entry], error: ServiceError) -> None:
        self._hand_back(entries, [None] * len(entries), error)

    def _hand_back(self, entries: list[Entry], values: list, error: ServiceError | None = None) -> None:
        """Record each entry's outcome in its request; hand the requests this finished to their sinks, one call
        per sink (one wake-up of an event loop, one message to a front end) rather than one per input."""
        finished: dict[int, tuple[Sink, list[Ticket]]] = {}
        if error is not None:
            self._cancelled_since_scan = True  # the failed requests' other entries in the queue go too
        with self._results_lock:
            for entry, value in zip(entries, values):
                if entry.ticket.record(entry.index, value, error):
                    sink = entry.ticket.sink
                    finished.setdefault(id(sink), (sink, []))[1].append(entry.ticket)
        for sink, tickets in finished.values():
            sink.deliver(tickets)

    def _drop(self, entry: Entry, reason: str, error: ServiceError) -> None:
        """Answer an entry that will not be computed, and count why."""
        self.metrics.items_dropped.labels(reason).inc()
        self._fail([entry], error)


__all__ = ["BatchEngine", "BatchPolicy", "Batcher", "Entry", "LaunchedBatch", "PreparedBatch", "Sink", "Ticket"]
