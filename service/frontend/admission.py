"""Admission: a request that computes is refused with 429 while `--max-concurrent-requests` requests to its model are
in flight. Each served model has that many of its own, so that a flood on one model is refused while the others
keep being admitted. A request's model is the one its path names (/models/{name}/...), else the default model
(the OpenAI route's `model` field is read only later: point a client at /models/{name}/v1 for that model's own
admission).

The count is this process's own (`LocalRequestCount`, a server with one front end) or one over several front-end
processes (`SharedRequestCount`): each front end counts its requests in flight in its own row of a small shared
file (a column per model), and admits while the sum over all rows is under the limit.

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
from service.frontend.model_prefix import MODEL_SCOPE
from service.metrics import Metrics


def create_slots(path: Path, workers: int, models: int = 1) -> None:
    """The shared file, zeroed, one int64 per front end and model (done once, by the supervisor)."""
    path.write_bytes(bytes(8 * workers * models))


class SharedRequestCount:
    """`LocalRequestCount` counted over every front end."""

    def __init__(self, path: Path, slot: int, models: int = 1):
        with open(path, "r+b") as handle:
            self._map = mmap.mmap(handle.fileno(), 0)
        self._slots = np.frombuffer(self._map, dtype=np.int64).reshape(-1, models)
        if not 0 <= slot < len(self._slots):
            raise ValueError(f"slot {slot} outside the {len(self._slots)} front ends of {path}")
        self._slot = slot
        self._slots[slot] = 0  # a restarted front end starts with nothing in flight

    def total(self, model: int = 0) -> int:
        return int(self._slots[:, model].sum())

    def add(self, delta: int, model: int = 0) -> None:
        self._slots[self._slot, model] += delta


class LocalRequestCount:
    """Requests in flight in this process, per model: the admission count of a server with one front end."""

    def __init__(self, models: int = 1) -> None:
        self.counts = [0] * models

    def total(self, model: int = 0) -> int:
        return self.counts[model]

    def add(self, delta: int, model: int = 0) -> None:
        self.counts[model] += delta


class Admission:
    def __init__(self, app, limit: int, api_routes: frozenset[str], metrics: Metrics, route_label,
                 requests: LocalRequestCount | SharedRequestCount, models: list[str]):
        self.app = app
        self.limit = limit
        self.api_routes = api_routes  # the POST routes that compute
        self.metrics = metrics
        self.route_label = route_label
        self.requests = requests  # this process's count, or one shared by every front end
        self.models = {name: index for index, name in enumerate(models)}  # the default first

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in self.api_routes:
            return await self.app(scope, receive, send)
        name = scope.get(MODEL_SCOPE) or next(iter(self.models))
        model = self.models[name]
        if self.requests.total(model) >= self.limit:
            self.metrics.failures.labels(self.route_label(scope["path"]), "overloaded", name).inc()
            whose = f" by model {name}" if len(self.models) > 1 else ""
            return await error_response("overloaded", f"{self.limit} requests are being handled{whose} already; "
                                        "retry later", scope["path"], retry_after_s=1)(scope, receive, send)
        self.requests.add(1, model)
        try:
            await self.app(scope, receive, send)
        finally:
            self.requests.add(-1, model)
