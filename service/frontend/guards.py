"""ASGI middlewares in front of the routes, each with one job:

- `RequestMetrics`: counts every request and its answer, per route, status and duration;
- `CloseWhenDraining`: while the server drains, every answer closes its connection (`Connection: close`), so
  a keep-alive client sends its next request on a new connection (to a server that is not stopping) instead
  of losing it on a connection closed without an answer;
- `BodyLimit`: JSON content type (415), the body size limit (413) and the body's deadlines (408: no bytes for
  `body_idle_timeout_s`, or not whole within `body_timeout_s`; the connection is closed), the body read here
  and replayed;
and, beside them, `service.frontend.admission.Admission`: at most `max_concurrent_requests` API requests at once
(over every front-end process); beyond, 429 at once. It sits inside `BodyLimit` and counts a request only once
its body is in: a client that sends its headers and stalls holds a connection (bounded by the body deadlines
and `max_connections`, `service.frontend.connections`), never one of the slots complete requests need. Reading
a body that is already in the socket's buffer (nearly every request's) costs next to nothing, so refusals under
a flood stay immediate.
"""

from __future__ import annotations

import asyncio
import time

from service.frontend.body import replaying
from service.frontend.disconnects import can_sweep
from service.frontend.http_errors import error_response
from service.frontend.model_prefix import MODEL_SCOPE
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
            route, model = self.route_label(scope["path"]), scope.get(MODEL_SCOPE, "")
            self.metrics.requests.labels(route, str(status_holder.get("status", 500)), model).inc()
            self.metrics.request_seconds.labels(route, model).observe(time.perf_counter() - started)


class CloseWhenDraining:
    def __init__(self, app, lifecycle):
        self.app = app
        self.lifecycle = lifecycle  # service.frontend.runtime.Lifecycle: its state says whether we drain

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or self.lifecycle.state != "draining":
            return await self.app(scope, receive, send)  # (one begun before the drain may keep its connection)

        async def send_closing(message):
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"connection"]
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        await self.app(scope, receive, send_closing)


class BodyLate(Exception):
    """The body stalled, or did not arrive in full in time (the message says which)."""


class BodyLimit:
    def __init__(self, app, max_body_bytes: int, api_routes: frozenset[str], metrics: Metrics, route_label,
                 idle_timeout_s: float = 5.0, total_timeout_s: float = 30.0):
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.api_routes = api_routes  # the routes that take JSON
        self.metrics = metrics
        self.route_label = route_label
        self.idle_timeout_s = idle_timeout_s  # most seconds between two pieces of the body
        self.total_timeout_s = total_timeout_s  # most seconds for the whole body

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        refused, headers = self._refuse_by_headers(scope), None
        try:
            body = None if refused else await self._read_body(receive)
        except BodyLate as late:
            # The rest of the body may still come: the connection cannot carry another request, so it is closed.
            refused, body, headers = ("request_timeout", str(late)), None, {"Connection": "close"}
        if refused or body is None:
            kind, message = refused or self._too_large()
            self.metrics.failures.labels(self.route_label(scope["path"]), kind, scope.get(MODEL_SCOPE, "")).inc()
            return await error_response(kind, message, scope["path"], headers=headers)(scope, receive, send)
        await self.app(scope, replaying(body, receive), send)

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
        """The body, or None when it is over the size limit; raises BodyLate past either deadline. A body
        already whole (uvicorn's request object says so, as it does for nearly every request) is read without
        a timer (one costs 3.5 µs); otherwise one timer for the whole read, moved on at each piece."""
        cycle = can_sweep(receive)
        if cycle is not None and getattr(cycle, "more_body", True) is False:
            message = await receive()
            body = message.get("body", b"")
            return None if len(body) > self.max_body_bytes else body
        chunks, size = [], 0
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + self.total_timeout_s
        until = min(loop.time() + self.idle_timeout_s, give_up_at)
        try:
            async with asyncio.timeout(until) as timer:
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
                    until = min(loop.time() + self.idle_timeout_s, give_up_at)
                    timer.reschedule(until)
        except TimeoutError:
            if until == give_up_at:
                raise BodyLate(f"the request body did not arrive in full within {self.total_timeout_s:g} s") from None
            raise BodyLate(f"the request body stalled: no data for {self.idle_timeout_s:g} s "
                           f"({size} bytes received)") from None
        return b"".join(chunks)
