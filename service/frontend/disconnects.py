"""Noticing that a client has gone while its request waits for the engine, so that its queued inputs are dropped.

The ASGI way is a task per request that awaits `receive()` until "http.disconnect", cancelled when the answer is
ready: 25 µs of the event loop's CPU per request (a third of a one-sentence /embed; `bench.serving.request_cost`).
Under uvicorn, whose request object says whether its connection is gone (`disconnected`, set when the socket
closes), one timer per event loop looks at every waiting request instead, every SWEEP_S. `DirectEntry`
(service.frontend.fast_routes) hands that object over in the scope; any other server gets the task.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable

from starlette.requests import Request

OnGone = Callable[[], None]
Watch = Callable[[OnGone], Callable[[], None]]  # start watching (call OnGone once the client is gone); returns stop
HTTP_CYCLE = "bert.http_cycle"  # the scope key of uvicorn's request object
SWEEP_S = 0.05  # how late a departure may be noticed: far below any input's time in the queue that matters


def client_gone(request: Request) -> Watch:
    """How to watch `request`'s client: `watch(on_gone)` starts, and returns the function that stops it."""
    cycle = request.scope.get(HTTP_CYCLE)
    if cycle is not None:
        sweeper = _sweepers.get(asyncio.get_running_loop())
        if sweeper is None:
            sweeper = _sweepers[asyncio.get_running_loop()] = _Sweeper()
        return lambda on_gone: sweeper.watch(cycle, on_gone)
    return lambda on_gone: _watch_with_a_task(request, on_gone)


def can_sweep(receive) -> object | None:
    """uvicorn's request object behind its `receive`, if it says whether the connection is gone; else None."""
    cycle = getattr(receive, "__self__", None)
    return cycle if isinstance(getattr(cycle, "disconnected", None), bool) else None


class _Sweeper:
    def __init__(self) -> None:
        self._watched: dict[int, tuple[object, OnGone]] = {}
        self._next_key = 0
        self._timer: asyncio.TimerHandle | None = None

    def watch(self, cycle, on_gone: OnGone) -> Callable[[], None]:
        key = self._next_key
        self._next_key += 1
        self._watched[key] = (cycle, on_gone)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(SWEEP_S, self._sweep)
        return lambda: self._watched.pop(key, None)

    def _sweep(self) -> None:
        self._timer = None
        for key in [key for key, (cycle, _) in self._watched.items() if cycle.disconnected]:
            self._watched.pop(key)[1]()
        if self._watched:
            self._timer = asyncio.get_running_loop().call_later(SWEEP_S, self._sweep)


_sweepers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Sweeper] = weakref.WeakKeyDictionary()


def _watch_with_a_task(request: Request, on_gone: OnGone) -> Callable[[], None]:
    async def wait_for_disconnect() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        on_gone()

    task = asyncio.ensure_future(wait_for_disconnect())
    return task.cancel
