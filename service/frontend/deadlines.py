"""The front end's own bound on a request's wait for the engine: its queue deadline and a grace.

The engine answers a request that misses its deadline itself, but a stuck engine (a stopped process, a hung
device or thread) answers nothing. So each front end watches its waiting requests: one still unanswered at
`queue_timeout_s + deadline_grace_s` is answered 503 here, unless the engine is computing right then (its
heartbeat is fresh and it is making progress: the request's batch reached the device in time and is still
running), in which case it is looked at again every RECHECK_S for as long as that holds.

One timer per front door rather than one per request (a timer armed and cancelled per request cost ~2 µs, and
the event loop keeps every cancelled one until its time): every request waits the same length of time, so the
order of arrival is the order of deadlines, and a dict in arrival order is the queue.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

RECHECK_S = 0.25  # how often a request past its deadline and grace is looked at while the engine computes


class DeadlineWatch:
    def __init__(self, wait_s: float, computing: Callable[[], bool], give_up: Callable[[object], None]):
        self.wait_s = wait_s  # queue_timeout_s + deadline_grace_s
        self.computing = computing  # the engine link's: whether a late request is worth waiting for
        self.give_up = give_up  # answers one request 503
        self._waiting: dict[int, tuple[float, object]] = {}  # key -> (when to look, pending), in arrival order
        self._overtime: dict[int, object] = {}  # past their time, waited for while the engine computes
        self._keys = itertools.count()
        self._timer: asyncio.TimerHandle | None = None

    def watch(self, pending) -> int:
        """Start watching `pending` (a `service.frontend.link.Pending`); returns the key for `forget`."""
        key = next(self._keys)
        loop = asyncio.get_running_loop()
        when = loop.time() + self.wait_s
        self._waiting[key] = (when, pending)
        if self._timer is None:
            self._timer = loop.call_at(when, self._look)
        return key

    def forget(self, key: int) -> None:
        """The request is answered (or its client left)."""
        if self._waiting.pop(key, None) is None:
            self._overtime.pop(key, None)

    def _look(self) -> None:
        self._timer = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        due = []
        for key, (when, pending) in self._waiting.items():
            if when > now:
                break
            due.append(key)
        late = [(key, self._waiting.pop(key)[1]) for key in due] + list(self._overtime.items())
        late = [(key, pending) for key, pending in late if not pending.result.done()]
        self._overtime = {}
        if late and self.computing():
            self._overtime = dict(late)
        else:
            for _, pending in late:
                self.give_up(pending)
        next_look = [when for when, _ in itertools.islice(self._waiting.values(), 1)]
        if self._overtime:
            next_look.append(now + RECHECK_S)
        if next_look:
            self._timer = loop.call_at(min(next_look), self._look)
