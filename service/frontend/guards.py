"""ASGI middlewares in front of the routes, each with one job:

- `RequestMetrics`: counts every request and its answer, per route, status and duration;
- `Admission`: at most `max_concurrent_requests` API requests at once (over every front-end process,
  `service.frontend.admission`); beyond, 429 at once;
- `BodyLimit`: JSON content type (415) and the body size limit (413), the body read here and replayed.

Refusals happen before the body is read: under a flood, refusing costs next to nothing, so the event
loop keeps up with arrivals and an accepted request waits only for those admitted before it.
"""

from __future__ import annotations

import time

from service.frontend.http_errors import error_response
from service.metrics import Metrics


class RequestMetrics:
    def __init__(self, app, metrics: Metrics, counts, route_label):
        self.app = app
        self.metrics = metrics
        self.counts = counts  # RequestCounts: accepted and fully answered
        self.route_label = route_label  # path -> metrics label (unknown paths share one label)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        status_holder = {}
        self.counts.accepted += 1

        async def send_and_count(message):
            if message["type"] == "http.response.start":
                status_holder["status"] = message["status"]
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                self.counts.answered += 1

        try:
            await self.app(scope, receive, send_and_count)
        finally:
            route = self.route_label(scope["path"])
            self.metrics.requests.labels(route, str(status_holder.get("status", 500))).inc()
            self.metrics.request_seconds.labels(route).observe(time.perf_counter() - started)


class InFlight:
    """Requests in flight in this process: the admission count of a server with one front end."""

    def __init__(self) -> None:
        self.count = 0

    def total(self) -> int:
        return self.count

    def add(self, delta: int) -> None:
        self.count += delta


class Admission:
    def __init__(self, app, limit: int, api_routes: frozenset[str], metrics: Metrics, route_label,
                 in_flight: InFlight):
        self.app = app
        self.limit = limit
        self.api_routes = api_routes  # the POST routes that compute
        self.metrics = metrics
        self.route_label = route_label
        self.in_flight = in_flight  # this process's count, or one shared by every front end

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in self.api_routes:
            return await self.app(scope, receive, send)
        if self.in_flight.total() >= self.limit:
            self.metrics.failures.labels(self.route_label(scope["path"]), "overloaded").inc()
            return await error_response("overloaded", f"{self.limit} requests are being handled already; retry later",
                                        scope["path"], retry_after_s=1)(scope, receive, send)
        self.in_flight.add(1)
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight.add(-1)


class BodyLimit:
    def __init__(self, app, max_body_bytes: int, api_routes: frozenset[str], metrics: Metrics, route_label):
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.api_routes = api_routes  # the routes that take JSON
        self.metrics = metrics
        self.route_label = route_label

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        refused = self._refuse_by_headers(scope)
        body = None if refused else await self._read_body(receive)
        if refused or body is None:
            kind, message = refused or self._too_large()
            self.metrics.failures.labels(self.route_label(scope["path"]), kind).inc()
            return await error_response(kind, message, scope["path"])(scope, receive, send)
        await self.app(scope, _replay(body, receive), send)

    def _too_large(self) -> tuple[str, str]:
        return "payload_too_large", f"the request body is larger than {self.max_body_bytes} bytes"

    def _refuse_by_headers(self, scope) -> tuple[str, str] | None:
        """Content type other than JSON (on a route that takes JSON), or a declared length over the
        limit: refused before reading. Other paths go on to their 404 or 405."""
        headers = dict(scope["headers"])
        content_type = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
        if scope["path"] in self.api_routes and content_type != b"application/json" \
                and not content_type.endswith(b"+json"):
            shown = content_type.decode("latin-1") or "none"
            return "unsupported_media_type", f"content-type must be application/json (got {shown})"
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            return self._too_large()
        return None

    async def _read_body(self, receive) -> bytes | None:
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)


def _replay(body: bytes, receive):
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # after the body: disconnect notifications

    return replay
