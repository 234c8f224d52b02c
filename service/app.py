"""`create_app(settings) -> FastAPI`: routes, error mapping, request guard, and the model's lifespan."""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI

from service.errors import error_response, install_error_handlers
from service.routes import api, public
from service.settings import Settings
from service.state import ServiceState

log = logging.getLogger("service")

DESCRIPTION = """Contextual token embeddings, masked-token fill-in and next-sentence scores from a BERT checkpoint,
behind dynamic batching. Errors always have the body `{"error": "...", "error_type": "..."}`."""


class RequestGuard:
    """Pure ASGI middleware: admission (429 beyond max_concurrent_requests), body size limit (413),
    JSON content type (415), and per-route metrics.

    Both refusals happen before the body is read: under a flood, refusing costs next to nothing,
    so the event loop keeps up with arrivals and an accepted request waits only for the requests
    admitted before it. The body is read here (up to the limit) and replayed to the app, so a body
    that is too large is refused before anything parses it, whether or not it announced its length.
    """

    def __init__(self, app, state: ServiceState):
        self.app = app
        self.state = state
        self.in_flight = 0  # requests on the JSON routes being handled now

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        route = route_label(scope["path"])
        status_holder = {}
        self.state.accepted += 1

        async def send_and_count(message):
            if message["type"] == "http.response.start":
                status_holder["status"] = message["status"]
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                self.state.answered += 1

        admitted = False
        try:
            if scope["method"] == "POST":
                json_route = scope["path"] in JSON_ROUTES
                limit = self.state.settings.max_concurrent_requests
                if json_route and self.in_flight >= limit:
                    self.state.metrics.failures.labels(route, "overloaded").inc()
                    return await error_response(
                        "overloaded", f"{limit} requests are being handled already; retry later", retry_after_s=1,
                    )(scope, receive, send_and_count)
                if json_route:
                    self.in_flight += 1
                    admitted = True
                rejected = self._refuse_by_headers(scope, json_route)
                body = None if rejected else await self._read_body(receive)
                if rejected or body is None:
                    kind, message = rejected or self._too_large()
                    self.state.metrics.failures.labels(route, kind).inc()
                    return await error_response(kind, message)(scope, receive, send_and_count)
                receive = _replay(body, receive)
            await self.app(scope, receive, send_and_count)
        finally:
            if admitted:
                self.in_flight -= 1
            status = status_holder.get("status", 500)
            self.state.metrics.requests.labels(route, str(status)).inc()
            self.state.metrics.request_seconds.labels(route).observe(time.perf_counter() - started)

    def _too_large(self) -> tuple[str, str]:
        return "payload_too_large", f"the request body is larger than {self.state.settings.max_body_bytes} bytes"

    def _refuse_by_headers(self, scope, json_route: bool) -> tuple[str, str] | None:
        """Content type other than JSON (on a route that takes JSON), or a declared length over the
        limit: refused before reading. Other paths go on to their 404 or 405."""
        headers = dict(scope["headers"])
        content_type = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
        if json_route and content_type != b"application/json" and not content_type.endswith(b"+json"):
            shown = content_type.decode("latin-1") or "none"
            return "unsupported_media_type", f"content-type must be application/json (got {shown})"
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.state.settings.max_body_bytes:
            return self._too_large()
        return None

    async def _read_body(self, receive) -> bytes | None:
        limit = self.state.settings.max_body_bytes
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
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


JSON_ROUTES = {"/encode", "/fill-mask", "/nsp"}
ROUTES = JSON_ROUTES | {"/health", "/info", "/metrics"}


def route_label(path: str) -> str:
    """Metrics label: the route, or "other" (unknown paths must not create unbounded label values)."""
    return path if path in ROUTES else "other"


def create_app(settings: Settings | None = None, engine_factory=None) -> FastAPI:
    """The service as an ASGI app. `engine_factory(model, pad_id, device, dtype)` replaces the engine
    (tests inject faults through it)."""
    settings = settings or Settings()
    state = ServiceState(settings, engine_factory)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        # Load in the background: the server answers /health with 503 until the model is warm.
        async def load():
            try:
                await asyncio.to_thread(state.load)
            except Exception as exc:  # noqa: BLE001 - reported, and the process stops (see __main__)
                state.load_error = str(exc)
                log.error("cannot serve: %s", exc)
                if app.state.on_load_failure is not None:
                    app.state.on_load_failure(exc)

        app.state.loading = asyncio.create_task(load())
        try:
            yield
        finally:
            state.draining = True
            if not app.state.loading.done():
                await app.state.loading
            await asyncio.to_thread(state.shutdown)
            log.info("shutdown: answered %d of %d accepted requests", state.answered, state.accepted)

    app = FastAPI(title="BERT service", version="0.1.0", description=DESCRIPTION, lifespan=lifespan)
    app.state.service = state
    app.state.on_load_failure = None
    install_error_handlers(app, on_error=lambda kind, request: state.metrics.failures.labels(
        route_label(request.url.path), kind).inc())
    app.include_router(public)
    app.include_router(api)
    app.add_middleware(RequestGuard, state=state)
    return app
