"""A front end's client connections, bounded: uvicorn's httptools protocol with the two limits it lacks.

- Headers have a deadline (`header_timeout_s`). uvicorn arms its one timer (keep-alive) only once an answer
  is sent, and cancels it at the next byte: a connection that opens and sends nothing, or sends its headers a
  byte at a time, is never closed. Here a request's headers must be in within `header_timeout_s` of the
  connection's opening (the first request) or of the request's first byte (the next ones on a kept-alive
  connection); past it, a request that has begun gets 408 and the connection is closed (one that sent nothing
  is closed without a word, as an idle connection would be).
- Headers have a size limit (MAX_HEADER_BYTES, as h11's default is for uvicorn's other parser; httptools has
  none): within its deadline a fast client could otherwise send megabytes of headers, all kept. Past it uvicorn
  answers 400 (its parser's error) and closes the connection.
- At most `max_connections` open connections: a request on a connection beyond it is answered 503 (JSON,
  Retry-After, `Connection: close`). uvicorn's own `limit_concurrency` answers such requests with a plain-text
  503, and counts running requests too, so a burst of slow requests would refuse every new one, even /health.

The body's deadlines are `service.frontend.guards.BodyLimit`'s: once the headers are in, the request is the app's.
"""

from __future__ import annotations

import asyncio

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service.frontend.http_errors import error_body, error_response

MAX_HEADER_BYTES = 64 * 1024  # the request line and every header of one request


def bounded_protocol(header_timeout_s: float, max_connections: int) -> type[asyncio.Protocol]:
    """The protocol class uvicorn instantiates per connection (its `http=` setting), with these limits."""

    class BoundedHttpProtocol(HttpToolsProtocol):
        headers_timer: asyncio.TimerHandle | None = None
        over_cap = False
        reading_headers = False  # a request has begun and its headers are not all in
        header_bytes = 0

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self.over_cap = len(self.connections) > max_connections
            self.headers_timer = self.loop.call_later(header_timeout_s, self._headers_late)

        def connection_lost(self, exc) -> None:
            self._stop_headers_timer()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self.reading_headers, self.header_bytes = True, 0
            idle = self.cycle is None or self.cycle.response_complete  # not a pipelined request behind an answer
            if self.headers_timer is None and idle:
                self.headers_timer = self.loop.call_later(header_timeout_s, self._headers_late)

        def on_url(self, url: bytes) -> None:
            self._count_header_bytes(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count_header_bytes(len(name) + len(value))
            super().on_header(name, value)

        def _count_header_bytes(self, size: int) -> None:
            self.header_bytes += size
            if self.header_bytes > MAX_HEADER_BYTES:  # the parser stops: uvicorn answers 400 and closes
                raise ValueError(f"request headers over {MAX_HEADER_BYTES} bytes")

        def on_headers_complete(self) -> None:
            self._stop_headers_timer()
            self.reading_headers = False
            if self.over_cap:
                self.app = _refuse_over_cap(max_connections)
            super().on_headers_complete()

        def _stop_headers_timer(self) -> None:
            if self.headers_timer is not None:
                self.headers_timer.cancel()
                self.headers_timer = None

        def _headers_late(self) -> None:
            self.headers_timer = None
            if self.transport.is_closing() or not (self.cycle is None or self.cycle.response_complete):
                return
            if self.reading_headers:  # a request has started and its headers are not in: say why before closing
                self.transport.write(_raw_408(header_timeout_s))
            self.transport.close()

    return BoundedHttpProtocol


def _raw_408(header_timeout_s: float) -> bytes:
    """A whole 408 answer, written without the app (there is no request to hand it: its headers never came)."""
    _, body = error_body("request_timeout", f"the request headers did not arrive within {header_timeout_s:g} s")
    payload = orjson.dumps(body)
    return (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
            b"content-length: %d\r\n\r\n" % len(payload)) + payload


def _refuse_over_cap(max_connections: int):
    async def refuse(scope, receive, send) -> None:
        message = f"this server has {max_connections} connections open already; retry later"
        response = error_response("unavailable", message, scope.get("path", ""), retry_after_s=1,
                                  headers={"Connection": "close"})
        await response(scope, receive, send)

    return refuse
