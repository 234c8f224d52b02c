"""Dynamic batching of one model's requests. Knows nothing of HTTP; decides *when* and *what* runs together.

Every input of every request to the model is one entry in its queue (`ModelQueue`, kept by length). The model's
preparer thread picks the next batch (`choose_span`: anchored on the oldest entry, filled with entries of similar
length under the token budget, so padding stays small) and collates it while the device is busy: one batch is always
ready ahead. The device's runners (`service.engine.device_runners`, shared by every model on the device, which also
decides whose batch goes next) compute it with this model's engine and hand the results back here: each item's
result goes into its request's `Ticket`, and the requests a batch finishes go to their `Sink` together (an event loop
in this process, or the engine process's socket back to a front end).
Entries whose client went away are dropped before compute, entries past their deadline get `unavailable`, and a
batch that runs out of device memory is split in two and retried.

An idle model (nothing computing, prepared or being collated: one client, a few) has an idle runner pick and collate
a new request's batch itself, as the preparer would: one thread hand-over to the compute instead of two (submitter ->
preparer -> runner). Under load the preparer alone picks (its wake-up lets a batch gather company; at 16 clients x 8
a runner picking at once made smaller batches, 0.94x the sentences/s), and with max_wait_s above 0.

With several runners (a CPU, each on its share of the cores), work that finds a runner idle is split evenly over
them (`batch_choice.even_split`): a request alone has every core. Work that comes while all are busy is not split.

`Batcher(engine, policy, metrics)` alone has runners of its own (a server of one model, the corpus job); several
models share one device's runners (`device=`, service.engine.models).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from functools import partial

from service.engine.batch_choice import SplitUnderWay, even_split, pricing
from service.engine.batch_types import BatchEngine, BatchPolicy, PreparedBatch
from service.engine.device_runners import DeviceRunners
from service.engine.model_queue import ModelQueue
from service.engine.threads import name_os_thread
from service.engine.tickets import Entry, LaunchedBatch, Sink, Ticket, note_batch
from service.errors import ServiceError
from service.metrics import Metrics, observe_all

log = logging.getLogger("service")


class Batcher:
    def __init__(self, engine: BatchEngine, policy: BatchPolicy, metrics: Metrics, device: DeviceRunners | None = None,
                 name: str = "", weight: float = 1.0):
        self.engine = engine
        self.policy = policy
        self.metrics = metrics.for_model(name)  # the model's own series
        self.name = name  # the served model's name ("" for a batcher that serves no named model: a job, a test)
        self.weight = weight  # its share of the device, in tokens, against the other models'
        self._owns_device = device is None
        self.device = device or DeviceRunners(policy.runners, policy.runner_niceness)
        self.device.attach(self)
        self._lock = self.device.lock
        self._cond = threading.Condition(self._lock)  # this model's preparer waits on it
        self._queue = ModelQueue()
        # What the preparer keeps of the queue, so that a wake-up costs nothing per entry: the earliest deadline in
        # it, and whether a request was cancelled since the last look at every entry.
        self._earliest_deadline = float("inf")
        self._cancelled_since_scan = False
        self._split: SplitUnderWay | None = None  # an even split of the queue under way (`_choose`)
        self.prepared: tuple[list[Entry], PreparedBatch] | None = None  # the one batch ready ahead
        self.running = 0  # batches taken by runners and not yet answered (on a GPU, up to two a runner)
        self.express_running = 0  # those of them on the device's express runners (device_runners)
        self.express_tokens = 0  # tokens of the request that woke this model still to be taken (device_runners)
        self.clock = 0.0  # the fair share's virtual time: tokens computed over weight (device_runners)
        self._stopping = False
        self.preparer_finished = False  # set by the preparer once stopping and the queue is empty
        self._collating = False  # the preparer has chosen a batch and is collating it
        self._preparer: threading.Thread | None = None
        self._results_lock = threading.Lock()  # runners finish entries of one request concurrently
        self._recent_batch_s = 0.05  # for Retry-After: how fast the queue drains
        self.progress_at = time.monotonic()  # when a taken batch was last done with, or work came to an idle model

    # ---- life cycle ----------------------------------------------------------------------------

    def start(self) -> None:
        name = f"bert-preparer-{self.name}" if self.name else "bert-preparer"
        self._preparer = threading.Thread(target=self._prepare_loop, name=name, daemon=True)
        self._preparer.start()
        if self._owns_device:
            self.device.start()

    def stop(self, timeout: float = 60.0) -> None:
        """Finish everything already queued, then stop the preparer (and the runners, if they are this model's)."""
        with self._lock:
            self._stopping = True
            self._cond.notify_all()
            self.device.wake_all()
        if self._preparer is not None:
            self._preparer.join(timeout)
        if self._owns_device:
            self.device.join(timeout)

    @property
    def workers_alive(self) -> bool:
        """Whether this model's preparer and the device's runners are all still running (liveness: a dead one never
        comes back)."""
        return self._preparer is not None and self._preparer.is_alive() and self.device.alive

    def has_work(self) -> bool:
        return bool(self._queue or self.running or self.prepared is not None or self._collating)

    def stalled_for(self) -> float:
        """Seconds the model has had work (queued, being prepared or computed) without finishing a batch; 0 while
        idle. A hung device, a deadlocked thread or a stopped process shows here (the engine's heartbeat)."""
        return max(0.0, time.monotonic() - self.progress_at) if self.has_work() else 0.0

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
                whose = f" for model {self.name}" if self.name else ""
                raise ServiceError("overloaded", f"the queue is full{whose} ({len(self._queue)} inputs waiting); retry "
                                   "later", retry_after_s=wait)
            now = time.monotonic()
            entries = [Entry(item, ticket, index, now) for index, item in enumerate(items)]
            idle = not self.has_work()
            tokens = self._queue.add(entries)
            if idle:
                self.progress_at = now  # an idle model's clock starts with its work
                # the request that wakes it goes ahead, up to a batch per runner (device_runners)
                self.express_tokens = min(tokens, self.device.runners * self.policy.max_batch_tokens)
                self.device.wake_clock(self, self.express_tokens / self.weight)
            sooner = ticket.deadline < self._earliest_deadline
            self._earliest_deadline = min(self._earliest_deadline, ticket.deadline)
            self.metrics.queue_depth.set(len(self._queue))
            # An idle runner picks it itself (module docstring); with a batch prepared the preparer waits for a runner.
            if self.runner_may_pick():
                self.device.batch_ready.notify()
            elif self.prepared is None or sooner:
                self._cond.notify()

    def cancel(self, ticket: Ticket) -> None:
        """The request's client went away: its entries that have not run are dropped (any thread)."""
        ticket.cancelled = True
        self._cancelled_since_scan = True

    # ---- preparing (preparer thread) ------------------------------------------------------------

    def _prepare_loop(self) -> None:
        name_os_thread()
        while True:
            with self._lock:
                chosen = self._wait_and_select()
                if chosen is None:
                    self.preparer_finished = True
                    self.device.wake_all()
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
                self.prepared, self._collating = (chosen, batch), False
                self.device.batch_prepared()

    def _wait_and_select(self) -> list[Entry] | None:
        """Under the lock: wait until there is something to run and nowhere for it to wait, then pick it."""
        policy = self.policy
        while True:
            self._drop_dead_entries()
            if self._stopping and not self._queue:
                return None
            if self.prepared is None and self._queue:
                idle = self.device.runners_busy() < self.device.runners
                short = self._queue.tokens < policy.max_batch_tokens // 2 and \
                    len(self._queue) < policy.max_batch_size
                # Wait for company only when the device would otherwise sit idle with a small batch (the oldest entry
                # is looked up only then: under load the batch is taken at once, and `take` finds it anyway).
                if idle and short and policy.max_wait_s > 0 and not self._stopping:
                    waited = time.monotonic() - self._queue.oldest().enqueued_at
                    if waited < policy.max_wait_s:
                        self._cond.wait(policy.max_wait_s - waited)
                        continue
                return self._choose()[0]
            self._cond.wait(self._next_deadline_in())

    def _choose(self) -> tuple[list[Entry], int]:
        """Under the lock: the next batch, taken from the queue, and its tokens; work that finds a runner idle is
        split evenly over the runners (`even_split`, `SplitUnderWay`)."""
        if self._split is None:
            batches = even_split(self._queue.tokens, len(self._queue), self.policy, *self.device.split_over(self))
            self._split = SplitUnderWay(batches, self._queue.tokens) if batches is not None else None
        target = self._split.target() if self._split is not None else None
        chosen, tokens = self._queue.take(self.policy, pricing(self.engine), target)
        if self._split is not None and not (self._split.took(tokens) and self._queue):
            self._split = None
        # _earliest_deadline stays a lower bound: at worst one needless look through the queue sets it exactly. An
        # empty queue has none, so that the next entry counts as sooner and wakes the preparer: with a batch prepared,
        # the preparer sleeps without a timeout over an empty queue, and (were its runner stuck) would never drop
        # that entry at its deadline.
        if not self._queue:
            self._earliest_deadline = float("inf")
        self.metrics.queue_depth.set(len(self._queue))
        return chosen, tokens

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
        dead = self._queue.remove_where(lambda e: e.ticket.cancelled or now > e.ticket.deadline)
        # why each goes, read before any is answered (answering a request's first entry cancels the rest of it)
        for entry, disconnected in [(e, e.ticket.cancelled) for e in dead]:
            if disconnected:
                self._drop(entry, "disconnected", ServiceError("unavailable", "client disconnected"))
            else:
                self._drop(entry, "deadline", ServiceError(
                    "unavailable", "the request waited in the queue past its deadline", retry_after_s=1))
        self._earliest_deadline = min((e.ticket.deadline for e in self._queue), default=float("inf"))
        self.metrics.queue_depth.set(len(self._queue))

    # ---- what the device's runners ask (under the device's lock) ------------------------------------

    def runner_may_pick(self) -> bool:
        """Whether an idle runner picks this model's next batch itself (the model idle: module docstring)."""
        return bool(self.device.idle_runners and self._queue and not self.running and self.prepared is None
                    and not self._collating and self.policy.max_wait_s == 0)

    def preparing_soon(self) -> bool:
        """Whether the preparer is about to have a batch ready (entries queued, or one being collated)."""
        return self.prepared is None and bool(self._queue or self._collating)

    def take_prepared(self) -> tuple[list[Entry], PreparedBatch]:
        taken, self.prepared = self.prepared, None
        self.running += 1
        self.clock += taken[1].real_tokens / self.weight
        self.express_tokens -= taken[1].real_tokens
        self._cond.notify()  # the preparer may prepare the next batch now
        return taken

    def pick_for_runner(self) -> list[Entry]:
        """The entries of the next batch, for an idle runner to collate; [] if the queue turned out empty."""
        self._drop_dead_entries()
        if not self._queue:
            return []
        chosen, tokens = self._choose()
        self.running += 1
        self.clock += tokens / self.weight
        self.express_tokens -= tokens
        self._cond.notify()  # what did not fit, if any: the preparer prepares it
        return chosen

    def wake_preparer(self) -> None:
        self._cond.notify()

    # ---- computing (on a runner's thread) ----------------------------------------------------------

    def collate_own(self, chosen: list[Entry]) -> PreparedBatch | None:
        """Collate a batch a runner picked itself; None (its entries failed, the batch released) if that fails."""
        try:
            return self.engine.collate([e.item for e in chosen])
        except Exception:  # noqa: BLE001 - a bad batch fails its own entries only
            log.exception("collate failed")
            self._fail(chosen, ServiceError("internal", "internal error while preparing the batch"))
            self.device.release(self)
            return None

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
        observe_all(self.metrics.queue_seconds, [now - entry.enqueued_at for entry in alive])
        return alive, batch

    def run_batch(self, chosen: list[Entry], batch: PreparedBatch) -> Callable[[], None] | None:
        """Compute a batch; returns the hand-back of its results, which the runner makes once it has released the
        batch, so that a client sending its next request on this answer finds the runners free (the even split
        then treats two requests sent one after the other alike: the same batches, the same answers bit for bit).
        None when there is nothing to hand back (its entries are gone, or a failure was answered already)."""
        alive, batch = self._alive(chosen, batch)
        return self._run_splitting(alive, batch) if alive else None

    def _run_splitting(self, entries: list[Entry], batch: PreparedBatch) -> Callable[[], None] | None:
        started = time.perf_counter()
        try:
            results = self.engine.run(batch)
        except Exception as exc:  # noqa: BLE001 - failures fan out to this batch's entries only
            self._recover(entries, exc)
            return None
        self._observe(started, batch, entries)
        return partial(self._hand_back, entries, results)

    def launch(self, chosen: list[Entry], batch: PreparedBatch) -> LaunchedBatch | None:
        alive, batch = self._alive(chosen, batch)
        if not alive:
            return None
        started = time.perf_counter()
        try:
            return LaunchedBatch(alive, batch, self.engine.launch(batch), started, self)
        except Exception as exc:  # noqa: BLE001 - as in _run_splitting (out of memory surfaces at launch)
            self._recover(alive, exc)
            return None

    def finish(self, on_device: LaunchedBatch) -> None:
        try:
            results = self.engine.finish(on_device.work)
        except Exception:  # noqa: BLE001 - a device error found at the wait: this batch's entries fail
            log.exception("batch of %d failed", len(on_device.entries))
            self._fail(on_device.entries, ServiceError("internal", "internal error while computing the batch"))
            return
        self._observe(on_device.started, on_device.batch, on_device.entries)
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
                hand_back = self._run_splitting(part, self.engine.collate([e.item for e in part]))
                if hand_back is not None:
                    hand_back()
            return
        if out_of_memory:
            error = ServiceError("unavailable", "the input does not fit in device memory", retry_after_s=5)
        else:
            log.error("batch of %d failed", len(entries), exc_info=exc)
            error = ServiceError("internal", "internal error while computing the batch")
        self._fail(entries, error)

    def _observe(self, started: float, batch: PreparedBatch, entries: list[Entry]) -> None:
        elapsed = time.perf_counter() - started
        self._recent_batch_s = 0.8 * self._recent_batch_s + 0.2 * elapsed
        note_batch(entries, batch, elapsed, self.metrics, self._results_lock)  # before any of them is handed back

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


__all__ = ["BatchEngine", "BatchPolicy", "Batcher", "DeviceRunners", "Entry", "LaunchedBatch", "PreparedBatch",
           "Sink", "Ticket"]
