"""The threads that feed one device, shared by every model served on it, and the rule that decides whose batch runs
next. Knows nothing of HTTP; knows of models only that each has a batcher with batches ready.

One runner per concurrent batch (one on a GPU; two on a CPU, each on half the cores) takes the next prepared batch
from the model queues it serves (`service.engine.batcher.Batcher`, one per model), computes it with that model's
engine, and hands its results back through that queue. Where the device runs asynchronously (a GPU), a runner
launches the next batch before it reads the last one's results, whichever models the two belong to; but a batch of
the request that woke a model, launched behind another model's batch, is read at once (after that batch, as they ran)
and the next launch waits: the woken request does not wait on the host for a launch of the busy model's as well,
whose every CUDA call may hand the interpreter to another thread (bench.serving.engine_pipeline --quiet-rate).

Whose batch runs next is fair by tokens (start-time fair queueing): each model has a virtual clock that a batch
taken advances by its tokens over the model's weight, and the prepared batch of the model with the earliest clock
goes first. A model that has been idle starts ahead of the earliest clock among the busy ones by the request that
woke it (at most one batch per runner), so every batch of that request goes before the busy models' next ones, and it
cannot save up credit while idle to flood the device later. With one model this is the batcher of a single-model
server, unchanged.

When every runner is busy with another model's batch, the request that wakes an idle model does not wait for those
batches either: it runs at once on an express runner, a thread idle otherwise. Only a woken request's batches go there
(`Batcher.express_tokens`): a model that stays busy shares the runners by the fair rule and never uses the express
runners, so two floods cost no oversubscription.

- On a CPU there is one express runner per runner, at a higher priority than the runners' (nice compute_niceness //
  2), and the woken request is split evenly over them as it would be over idle runners. The operating system then
  preempts the busy models' batches, as it would between separate servers, but in the woken model's favour.
- On a GPU (--gpu-express-lane) there is one, which queues its batches on a high-priority stream of its own
  (service.engine.streams): the woken model's kernels run beside the flood's batch instead of behind it, and its
  results are built at once on its own thread, not after the runner has finished the flood's batch and launched the
  next. A model's batches still use one stream at a time: its CUDA graphs' outputs are safe only because its next
  replay queues behind its last batch's heads on the same stream, so an express runner takes a model with no batch
  on the runner, and the runner no model with a batch on the express runner (`_one_stream`).

Measured in bench.serving.several_models and bench.serving.engine_pipeline --quiet-rate (BENCHMARKS.md, "Several
models").
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol

from service.engine.threads import lower_thread_priority, name_os_thread
from service.engine.tickets import LaunchedBatch

# With a batch in flight on the device, how long the runner waits for a preparer's next batch before it reads the
# one in flight instead: long enough for a collation (tens to hundreds of us), short next to a batch on the device.
AHEAD_WAIT_S = 0.002


class Batcher(Protocol):
    """What the runners ask of a model's queue (service.engine.batcher.Batcher), under the device's lock but for
    the computing calls, which run on a runner's thread without it."""

    engine: Any
    clock: float  # the fair share's virtual time
    prepared: Any  # (entries, batch) ready to run, or None
    preparer_finished: bool
    running: int  # its batches taken and not yet done with, on runners and express runners
    express_running: int  # those of them on express runners
    express_tokens: int  # tokens of the request that woke it still to be taken (module docstring)
    metrics: Any  # its series (service.metrics.ModelMetrics)
    progress_at: float

    def has_work(self) -> bool: ...
    def runner_may_pick(self) -> bool: ...
    def preparing_soon(self) -> bool: ...
    def take_prepared(self) -> tuple: ...
    def pick_for_runner(self) -> list: ...
    def wake_preparer(self) -> None: ...
    def collate_own(self, chosen: list) -> Any: ...
    def run_batch(self, chosen: list, batch: Any) -> Callable[[], None] | None: ...
    def launch(self, chosen: list, batch: Any) -> LaunchedBatch | None: ...
    def finish(self, on_device: LaunchedBatch) -> None: ...


class DeviceRunners:
    """The runners of one device and the lock that every model queue on it shares (one lock, several conditions:
    each preparer waits on its own, the runners on `batch_ready`)."""

    def __init__(self, runners: int = 1, niceness: int = 0, express: int = 0,
                 express_stream: Callable[[], AbstractContextManager] = nullcontext):
        self.runners = runners
        self.niceness = niceness
        self.express = express  # express runners (module docstring): 0 with one model, or when turned off
        self.express_stream = express_stream  # what each express runner enters for its life (service.engine.streams)
        self.lock = threading.Lock()
        self.batch_ready = threading.Condition(self.lock)  # the runners wait on it
        self.express_ready = threading.Condition(self.lock)  # the express runners wait on it
        self.queues: list[Batcher] = []
        self.idle_runners = 0  # runners waiting with nothing on the device: a new request may go to one of them
        self._threads: list[threading.Thread] = []

    def attach(self, queue: Batcher) -> None:
        """Serve `queue`'s batches too (before `start`)."""
        self.queues.append(queue)

    def start(self) -> None:
        loops = [(self._run_loop, f"bert-runner-{n}") for n in range(self.runners)]
        loops += [(self._express_loop, f"bert-express-{n}") for n in range(self.express)]
        for loop, name in loops:
            thread = threading.Thread(target=loop, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def join(self, timeout: float) -> None:
        for thread in self._threads:
            thread.join(timeout)

    @property
    def alive(self) -> bool:
        return all(thread.is_alive() for thread in self._threads)

    # ---- the fair choice (under the lock) ----------------------------------------------------------

    def wake_clock(self, queue: Batcher, ahead: float) -> None:
        """`queue` has work again after being idle: its clock starts `ahead` (the waking request's tokens over the
        model's weight, at most a batch per runner) and a little more before the busy models' earliest, so every
        batch of that request goes next, and the idle time earns it nothing."""
        busy = [q.clock for q in self.queues if q is not queue and q.has_work()]
        if busy:
            queue.clock = max(queue.clock, min(busy) - 1.0 - ahead)

    def batch_prepared(self) -> None:
        """A model has a prepared batch (under the lock): a runner takes it, or an express runner where it may."""
        self.batch_ready.notify()
        if self.express:
            self.express_ready.notify()

    def wake_all(self) -> None:
        """Stopping, or a preparer finished (under the lock): every runner looks again."""
        self.batch_ready.notify_all()
        self.express_ready.notify_all()

    def _next_prepared(self, express: bool = False) -> Batcher | None:
        """The model whose prepared batch a runner (an express runner: `express`) takes next: the earliest clock,
        then the oldest entry."""
        ready = [q for q in self.queues if q.prepared is not None and self._one_stream(q, express)]
        if not ready:
            return None
        return min(ready, key=lambda q: (q.clock, q.prepared[0][0].enqueued_at))

    def _one_stream(self, queue: Batcher, express: bool) -> bool:
        """Whether a runner (an express runner: `express`) may take `queue`'s batch now: where there are express
        runners and batches overlap on the device (a GPU), not while the model has one on the other kind of runner,
        which queues on another stream (module docstring)."""
        if not self.express or not queue.engine.overlaps:
            return True
        return queue.running == 0 if express else queue.express_running == 0

    def _express_choice(self) -> Batcher | None:
        """The model whose prepared batch an express runner takes now: the fair rule's next, while it still has a
        waking request's tokens to run (`express_tokens`) and every runner is computing a batch."""
        queue = self._next_prepared(express=True)
        if queue is None or queue.express_tokens <= 0:
            return None
        return queue if self.runners_busy() >= self.runners else None

    def runners_busy(self) -> int:
        """Batches on the runners now, every model's (those on express runners not counted)."""
        return sum(q.running - q.express_running for q in self.queues)

    def split_over(self, queue: Batcher) -> tuple[int, int]:
        """(runners, those busy) that `queue`'s next batches may be split evenly over (batch_choice.even_split): the
        runners; or, when every runner is busy and the request that woke `queue` goes express, the express runners,
        so that it has every core at their priority, in the batches it would have had alone."""
        busy = self.runners_busy()
        if busy >= self.runners and self.express and queue.express_tokens > 0:
            return self.express, sum(q.express_running for q in self.queues)
        return self.runners, busy

    def _may_pick(self) -> Batcher | None:
        """A model whose queue an idle runner picks from itself (its preparer idle), the earliest clock first."""
        open_queues = [q for q in self.queues if q.runner_may_pick()]
        return min(open_queues, key=lambda q: q.clock) if open_queues else None

    # ---- running (runner threads) ------------------------------------------------------------------

    def _run_loop(self) -> None:
        name_os_thread()
        lower_thread_priority(self.niceness)
        on_device: LaunchedBatch | None = None
        while True:
            taken = self._take(on_device is not None)
            if taken is None and on_device is None:
                return
            launched = None
            if taken is not None:
                queue, chosen, batch, woken = taken
                if batch is None:  # picked by this runner (idle): collated here
                    batch = queue.collate_own(chosen)
                if batch is not None:
                    if not queue.engine.overlaps:
                        self._compute(queue, chosen, batch)
                        continue
                    # The next batch goes to the device before the last one's results are read: with nothing
                    # prepared, the one in flight is finished at once (no batch waits for company that may not come).
                    launched = queue.launch(chosen, batch)
                    if launched is None:
                        self.release(queue)  # dropped, or failed (and answered) at launch
                    elif woken and on_device.queue is not queue:
                        # A woken model's batch behind another model's: both read now, in the order they run, not
                        # the woken one after the next launch (module docstring).
                        self._finish(on_device)
                        self._finish(launched)
                        on_device = None
                        continue
            if on_device is not None:
                self._finish(on_device)
            on_device = launched

    def _finish(self, on_device: LaunchedBatch) -> None:
        try:
            on_device.queue.finish(on_device)
        finally:
            self.release(on_device.queue)

    def _express_loop(self) -> None:
        """An express runner: computes a woken model's batch when every runner is busy (module docstring), on its
        own stream where the device has them."""
        name_os_thread()
        lower_thread_priority(self.niceness // 2)
        with self.express_stream():
            while True:
                with self.lock:
                    while (queue := self._express_choice()) is None:
                        if all(q.preparer_finished for q in self.queues):
                            return
                        self.express_ready.wait()
                    self._wake_other_preparers(queue)
                    chosen, batch = queue.take_prepared()
                    queue.express_running += 1
                queue.metrics.express_batches.inc()
                self._compute(queue, chosen, batch, express=True)

    def _compute(self, queue: Batcher, chosen: list, batch: object, express: bool = False) -> None:
        """Runs one batch to its results, releases the runner, then hands the results back: in that order, so that
        a client sending its next request on an answer finds the runner free (Batcher.run_batch says why)."""
        hand_back = None
        try:
            hand_back = queue.run_batch(chosen, batch)
        finally:
            self.release(queue, express)
        if hand_back is not None:
            hand_back()

    def _take(self, one_on_device: bool) -> tuple[Batcher, list, object, bool] | None:
        """(the model's queue, its entries, their prepared batch, whether they are taken with a batch in flight and
        belong to the request that woke the model) to run next. With none on the device it waits until some model has
        one or every preparer has finished (None); or, with every preparer idle, picks a model's next entries itself
        (their batch None: the runner collates them). With a batch in flight, None at once unless a preparer is about
        to prepare one; then up to AHEAD_WAIT_S."""
        with self.lock:
            if not one_on_device:
                self.idle_runners += 1
                try:
                    while True:
                        queue = self._next_prepared()
                        if queue is not None:
                            break
                        if all(q.preparer_finished for q in self.queues):
                            return None
                        picking = self._may_pick()
                        if picking is not None:
                            chosen = picking.pick_for_runner()
                            if chosen:
                                self._wake_other_preparers(picking)
                                return picking, chosen, None, False  # nothing in flight
                            continue
                        self.batch_ready.wait()
                finally:
                    self.idle_runners -= 1
            else:
                queue = self._next_prepared()
                if queue is None and any(q.preparing_soon() for q in self.queues):
                    self.batch_ready.wait(AHEAD_WAIT_S)
                    queue = self._next_prepared()
                if queue is None:
                    return None
            self._wake_other_preparers(queue)
            woken = one_on_device and queue.express_tokens > 0  # read before taking the batch uses them up
            taken = (queue, *queue.take_prepared(), woken)
            if self.express:  # every runner may be busy now: another model's prepared batch may go express
                self.express_ready.notify()
            return taken

    def _wake_other_preparers(self, taken: Batcher) -> None:
        """A request that came to an idle model woke a runner rather than the model's preparer (the runner would pick
        it itself); a runner that takes another model's batch instead wakes that preparer, or the request would wait
        for its deadline."""
        for queue in self.queues:
            if queue is not taken and queue.preparing_soon():
                queue.wake_preparer()

    def release(self, queue: Batcher, express: bool = False) -> None:
        """A batch taken from `queue` (by an express runner: `express`) is done with (answered, failed or dropped)."""
        # The model's preparer is not woken: nothing it waits for changes here (its batch taken, new entries or a
        # deadline do; fewer busy runners never end a wait for company). Waking it every batch cost a thread hand-over
        # for nothing (4.5% of the engine's interpreter time in bench.serving.engine_pipeline's profile).
        with self.lock:
            queue.running -= 1
            queue.express_running -= express
            queue.progress_at = time.monotonic()
            if express and queue.engine.overlaps and queue.prepared is not None:  # passed by (`_one_stream`)
                self.batch_ready.notify()
