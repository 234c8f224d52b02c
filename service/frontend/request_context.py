"""The outermost HTTP middleware: every answer carries `x-request-id` (the client's own, when it sent a usable
one), and, when the server keeps them, each request gets its record (`service.frontend.request_record`: traces,
the request id and trace id in its log lines, its own log line).

With traces off, the text log format and no request lines, a request costs this middleware one header and
nothing else (no record is made, the front door finds none).
"""

from __future__ import annotations

import time

from service.frontend.request_record import RequestRecord, request_id
from service.logs import CURRENT_REQUEST
from service.tracing import Tracing

REQUEST_ID = b"x-request-id"
TRACEPARENT = b"traceparent"


class RequestContext:
    def __init__(self, app, route_label, tracing: Tracing | None = None, keep_records: bool = False,
                 log_requests: bool = False, default_model=lambda: ""):
        """`keep_records`: make a record per request even without traces (JSON logs want its ids);
        `default_model()`: the name of the model a request that reached no model's front door is for, for the
        spans (the front door notes the one it computed with in the record)."""
        self.app = app
        self.route_label = route_label
        self.tracing = tracing
        self.records = keep_records or log_requests or tracing is not None
        self.log_requests = log_requests
        self.default_model = default_model

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        incoming = traceparent = None
        for name, value in scope["headers"]:
            if name == REQUEST_ID:
                incoming = value
            elif name == TRACEPARENT:
                traceparent = value
        if not self.records:
            header = (REQUEST_ID, request_id(incoming).encode())

            async def send_with_id(message):
                if message["type"] == "http.response.start":  # a fresh dict each time; its header list is not copied
                    message["headers"] = [*message.get("headers", ()), header]  # ... but may be the response's own
                await send(message)

            return await self.app(scope, receive, send_with_id)

        route = self.route_label(scope["path"])
        record = RequestRecord.begin(route, incoming, traceparent, self.tracing)
        header = (REQUEST_ID, record.request_id.encode())
        answer = {"status": 500, "ended": 0.0}

        async def send_recorded(message):
            if message["type"] == "http.response.start":
                answer["status"] = message["status"]
                message["headers"] = [*message.get("headers", ()), header]
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                answer["ended"] = time.monotonic()

        token = CURRENT_REQUEST.set(record)
        try:
            await self.app(scope, receive, send_recorded)
        finally:
            status = answer["status"]
            record.finish(self.tracing, f"{scope['method']} {route}", str(status), status >= 500, {
                "http.request.method": scope["method"], "http.route": route, "http.response.status_code": status,
                "bert.model": record.model or self.default_model()}, self.log_requests, answer["ended"] or None,
                error=f"HTTP {status}" if status >= 400 else None)
            CURRENT_REQUEST.reset(token)
