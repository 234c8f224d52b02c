"""One request as a front end saw it: its id, its trace, and when it did what. HTTP requests
(`service.frontend.request_context`) and gRPC calls and stream messages (`service.frontend.tei_grpc`) each get one,
set in `service.logs.CURRENT_REQUEST` while they are handled; the front door notes in it when the request
tokenized and what the engine said of its batches. Once the request is answered, `finish` turns it into spans (when
it is traced) and its log line (`--log-requests`).

The spans of a request, all but the first its children:

    POST /embed (or tei.v1.Embed/Embed, a stream's message)   the route, model, inputs, tokens, status
    ├── validate     from arrival to tokenization: the body, its parsing and checks (admission and the key too)
    ├── tokenize
    ├── queue        from the hand-off to the engine to the start of its first batch
    ├── inference    its batches' device time, linked to each batch's span (the engine's: one per batch, linked
    │                from every traced request in it; service.tracing.Tracing.batch)
    └── write        from the results' return to the last byte of the answer handed to the server

Times are time.monotonic() readings (one clock for every process of a host: the engine's too), turned into
wall-clock nanoseconds once, when the spans are recorded.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from dataclasses import dataclass

from service.tracing import TraceContext, Tracing, parse_traceparent

log = logging.getLogger("service.requests")
MAX_REQUEST_ID = 128  # characters of an incoming request id kept; longer or unprintable ones are replaced


_PROCESS_ID = os.urandom(6).hex()  # new ids: this process's random prefix and a count, unique across processes
_COUNT = itertools.count(1)


def request_id(incoming: str | bytes | None) -> str:
    """The client's request id when it is 1 to 128 printable ASCII characters without spaces, else a new one."""
    if incoming:
        if isinstance(incoming, bytes):
            incoming = incoming.decode("latin-1")
        if len(incoming) <= MAX_REQUEST_ID and all("!" <= c <= "~" for c in incoming):
            return incoming
    return f"{_PROCESS_ID}{next(_COUNT):08x}"  # no system call per request, as os.urandom would make


@dataclass(slots=True, eq=False)
class RequestRecord:
    request_id: str
    route: str
    received: float  # time.monotonic() at arrival
    caller: TraceContext | None = None  # the incoming traceparent's span
    trace: TraceContext | None = None  # this request's span, when it is traced
    deadline: float = 0.0  # time.monotonic() by which its inputs must reach the device (0: the server's default)
    tokenize_started: float = 0.0
    tokenized: float = 0.0
    inputs: int = 0
    tokens: int = 0
    chars: int = 0  # characters computed, when a caller counts them (a gRPC answer's Metadata)
    submitted: float = 0.0
    batch_started: float = 0.0
    inference_s: float = 0.0
    batch_spans: list[str] | None = None
    computed: float = 0.0  # when its results came back from the engine
    model: str = ""  # the served model that computed it (set by its front door)

    @classmethod
    def begin(cls, route: str, incoming_id, traceparent, tracing: Tracing | None,
              received: float | None = None) -> "RequestRecord":
        """The record of a request that arrives now (or arrived at `received`): its id (the client's, when usable), its
        caller's trace context (an incoming traceparent), and its own span's when `tracing` samples it."""
        caller = parse_traceparent(traceparent)
        record = cls(request_id(incoming_id), route, received or time.monotonic(), caller)
        if tracing is not None:
            record.trace = tracing.start(caller)
        return record

    @property
    def trace_id(self) -> str | None:
        """For the logs: this request's trace, or its caller's when it is not traced here."""
        context = self.trace or self.caller
        return context.trace_hex if context is not None else None

    def log_fields(self) -> dict:
        fields = {"request_id": self.request_id, "route": self.route}
        trace_id = self.trace_id
        if trace_id is not None:
            fields["trace_id"] = trace_id
        return fields

    # ---- what the front door notes --------------------------------------------------------------

    def tokenized_between(self, started: float, ended: float) -> None:
        if not self.tokenize_started:
            self.tokenize_started = started
        self.tokenized = ended

    def computed_by(self, items: list, submitted: float, timing: tuple[float, float, list[str] | None]) -> None:
        """The engine answered items submitted at `submitted` (a request may submit more than once: all count)."""
        started, inference_s, spans = timing
        self.inputs += len(items)
        self.tokens += sum(map(len, items))
        if not self.submitted:
            self.submitted = submitted
        if started and (not self.batch_started or started < self.batch_started):
            self.batch_started = started
        self.inference_s += inference_s
        if spans:
            self.batch_spans = [*(self.batch_spans or ()), *spans]
        self.computed = time.monotonic()

    # ---- the end ----------------------------------------------------------------------------------

    def finish(self, tracing: Tracing | None, name: str, status: str, failed: bool, attributes: dict,
               log_line: bool, ended: float | None = None, error: str | None = None, children: bool = True) -> None:
        """Record the request's spans (when traced) and its log line (when asked). `failed`: a server-side failure
        (the span's status is an error); `error`: the error kind, when the answer is one; `children`: False for a
        record that is not one request (a gRPC stream, whose messages are: its span alone)."""
        ended = ended or time.monotonic()
        if log_line:
            duration_ms = round((ended - self.received) * 1000, 3)
            log.info("%s %s %s %.1f ms", self.route, status, self.request_id, duration_ms,
                     extra={"status": status, "duration_ms": duration_ms})
        if self.trace is None or tracing is None:
            return
        try:
            self._spans(tracing, name, ended, attributes, error if failed else None, error, children)
        except Exception:  # noqa: BLE001 - a trace that cannot be recorded costs the request nothing
            logging.getLogger("service").exception("could not record the spans of request %s", self.request_id)

    def _spans(self, tracing: Tracing, name: str, ended: float, attributes: dict, failure: str | None,
               error_kind: str | None, children: bool) -> None:
        own = self.trace
        offset = time.time_ns() - int(time.monotonic() * 1e9)  # monotonic -> wall clock, read once

        def ns(t: float) -> int:
            return offset + int(t * 1e9)

        def child(span_name: str, start: float, end: float, extra: dict | None = None, links=()) -> None:
            tracing.record(span_name, TraceContext(own.trace_id, tracing.new_id()), own.span_id, ns(start),
                           ns(max(start, end)), extra, links=links)

        if children:
            answered_from = self.computed or self.tokenized or ended
            child("validate", self.received, self.tokenize_started or answered_from)
            if self.tokenize_started:
                child("tokenize", self.tokenize_started, self.tokenized)
            if self.submitted:
                batch_started = self.batch_started or self.computed
                child("queue", self.submitted, batch_started)
                if self.batch_started:
                    links = [c for c in map(parse_traceparent, self.batch_spans or ()) if c is not None]
                    child("inference", batch_started, min(batch_started + self.inference_s, self.computed or ended),
                          {"bert.batches": len(links)}, links)
            child("write", answered_from, ended)
            attributes = {**attributes, "bert.inputs": self.inputs, "bert.tokens": self.tokens}
        attributes = {**attributes, "bert.request_id": self.request_id}
        if error_kind:
            attributes["bert.error_type"] = error_kind
        tracing.record(name, own, self.caller.span_id if self.caller else None, ns(self.received), ns(ended),
                       {k: v for k, v in attributes.items() if v is not None}, kind="server", error=failure)

