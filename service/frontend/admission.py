"""Admission: a request that computes is refused with 429 while `--max-concurrent-requests` are in flight.

The count is this process's own (`LocalRequestCount`, a server with one front end) or one over several front-end
processes (`SharedRequestCount`): each front end counts its requests in flight in its own slot of a small shared
file, and admits while the sum over all slots is under the limit.

Each slot has one writer (its front end), so no lock is needed; a front end that dies is restarted
in the same slot, which it zeroes, so a killed process cannot leak admissions. Two front ends that
admit at the same instant may both pass at limit - 1: the limit can be exceeded by at most the number
of front ends minus one, which is noise against its purpose (bounding the queue under a flood).
"""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np

from service.frontend.http_errors import error_response
from service.metrics import Metrics


def create_slots(path: Path, workers: int) -> None:
    """The shared file, zeroed, one int64 per front end (done once, by the supervisor)."""
    path.write_bytes(bytes(8 * workers))


class SharedRequestCount:
    """`LocalRequestCount` counted over every front end."""

    def __init__(self, path: Path, slot: int):
        with open(path, "r+b") as handle:
            self._map = mmap.mmap(handle.fileno(), 0)
        self._slots = np.frombuffer(self._map, dtype=np.int64)
        if not 0 <= slot < len(self._slots):
            raise ValueError(f"slot {slot} outside the {len(self._slots)} front ends of {path}")
        self._slot = slot
        self._slots[slot] = 0  # a restarted front end starts with nothing in flight

    def total(self) -> int:
        return int(self._slots.sum())

    def add(self, delta: int) -> None:
        self._slots[self._slot] += delta


class LocalRequestCount:
    """Requests in flight in this process: the admission count of a server with one front end."""

    def __init__(self) -> None:
        self.count = 0

    def total(self) -> int:
        return self.count

    def add(self, delta: int) -> None:
        self.count += delta


class Admission:
    def __init__(self, app, limit: int, api_routes: frozenset[str], metrics: Metrics, route_label,
                 requests: LocalRequestCount | SharedRequestCount):
        self.app = app
        self.limit = limit
        self.api_routes = api_routes  # the POST routes that compute
        self.metrics = metrics
        self.route_label = route_label
        self.requests = requests  # this process's count, or one shared by every front end

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in self.api_routes:
            return await self.app(scope, receive, send)
        if self.requests.total() >= self.limit:
            self.metrics.failures.labels(self.route_label(scope["path"]), "overloaded").inc()
            return await error_response("overloaded", f"{self.limit} requests are being handled already; retry later",
                                        scope["path"], retry_after_s=1)(scope, receive, send)
        self.requests.add(1)
        try:
            await self.app(scope, receive, send)
        finally:
            self.requests.add(-1)
