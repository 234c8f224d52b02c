"""OpenTelemetry traces of requests and of the batches they ran in, exported over OTLP. Off unless an endpoint is set.

Both sides use it: a front end records one span per request (HTTP, or a gRPC call or stream message) with a
child for each thing the request waited on or did (`service.frontend.request_record`); the engine records one
span per batch that holds a traced request, linked to each of those requests (`Tracing.batch`). A request's W3C
`traceparent` crosses to the engine in its Submit (service.messages); the batch spans' come back in its Done.

Spans are recorded once their times are known, as finished `ReadableSpan`s handed straight to the SDK's batch
processor: the SDK's own span API (a Tracer, a sampler call and a live Span object per span) cost ~45 µs a
span on this project's CPU, recording a finished one ~5 µs. The sampling decision is taken once per request,
as OTEL_TRACES_SAMPLER says (`Sampler`). The batch processor holds at most OTEL_BSP_MAX_QUEUE_SIZE spans
(2048) and drops the oldest beyond (with a log line): its thread exports them, so a collector that is down,
slow or refusing costs that bounded queue and log lines, never a request. Encoding spans into OTLP (the
exporter, on its thread) costs ~35 µs a span: at 100% sampling a traced request costs ~0.2 ms of CPU there,
which a CPU-bound model barely notices and a GPU host serving tens of thousands of requests a second does;
sample those (OTEL_TRACES_SAMPLER=parentbased_traceidratio, OTEL_TRACES_SAMPLER_ARG=0.01).
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlparse

log = logging.getLogger("service")

BATCH_SPAN = "batch"
SHUTDOWN_WAIT_S = 3.0  # at exit, how long the last spans may take to leave; a collector that is down loses them
_ID64 = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class TraceContext:
    """A span's identity, as a W3C traceparent carries it."""

    trace_id: int
    span_id: int
    sampled: bool = True

    @property
    def traceparent(self) -> str:
        return f"00-{self.trace_id:032x}-{self.span_id:016x}-{'01' if self.sampled else '00'}"

    @property
    def trace_hex(self) -> str:
        return f"{self.trace_id:032x}"


def parse_traceparent(value: str | bytes | None) -> TraceContext | None:
    """A W3C traceparent header (`00-<32 hex trace id>-<16 hex span id>-<2 hex flags>`), or None when it is
    absent or malformed (then the request starts a trace of its own, as the specification says)."""
    if not value:
        return None
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    parts = value.strip().split("-")
    if len(parts) < 4 or len(parts[0]) != 2 or len(parts[1]) != 32 or len(parts[2]) != 16 or len(parts[3]) != 2:
        return None
    version = parts[0].lower()
    if version == "ff" or (version == "00" and len(parts) != 4):
        return None
    try:
        int(version, 16)
        trace_id, span_id, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3], 16)
    except ValueError:
        return None
    if not trace_id or not span_id:
        return None
    return TraceContext(trace_id, span_id, bool(flags & 1))


class Sampler:
    """The standard OTEL_TRACES_SAMPLER (and OTEL_TRACES_SAMPLER_ARG) decision, taken once per request:
    always_on, always_off, traceidratio, and parentbased_* (the default, parentbased_always_on: a request
    continues its caller's decision, and one without a caller is sampled)."""

    NAMES = ("always_on", "always_off", "traceidratio", "parentbased_always_on", "parentbased_always_off",
             "parentbased_traceidratio")

    def __init__(self, name: str = "parentbased_always_on", argument: str | None = None):
        name = name.strip().lower()
        if name not in self.NAMES:
            log.warning("OTEL_TRACES_SAMPLER=%s is not one this server knows (%s); using parentbased_always_on",
                        name, ", ".join(self.NAMES))
            name = "parentbased_always_on"
        self.name = name
        self.parent_based = name.startswith("parentbased_")
        root = name.removeprefix("parentbased_")
        rate = 1.0
        if root == "traceidratio":
            try:
                rate = float(argument) if argument not in (None, "") else 1.0
            except ValueError:
                rate = -1.0
            if not 0.0 <= rate <= 1.0:
                log.warning("OTEL_TRACES_SAMPLER_ARG=%s is not a ratio from 0 to 1; sampling every trace", argument)
                rate = 1.0
        elif root == "always_off":
            rate = 0.0
        # As the SDK's TraceIdRatioBased: the trace id's low 64 bits below the rate's share of them.
        self.bound = round(rate * (1 << 64))

    @classmethod
    def from_environment(cls) -> "Sampler":
        # an empty variable (compose passes unset ones as "") means the default, as the SDK reads it
        return cls(os.environ.get("OTEL_TRACES_SAMPLER") or "parentbased_always_on",
                   os.environ.get("OTEL_TRACES_SAMPLER_ARG"))

    def sampled(self, trace_id: int, parent: TraceContext | None) -> bool:
        if self.parent_based and parent is not None:
            return parent.sampled
        return (trace_id & _ID64) < self.bound


def tracing_wanted(endpoint: str | None) -> bool:
    """Whether traces are exported: an endpoint set by flag or by the standard variables, and not turned off by
    OTEL_SDK_DISABLED or OTEL_TRACES_EXPORTER=none."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "none":
        return False
    return bool(endpoint or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def otlp_protocol(setting: str, endpoint: str | None) -> str:
    """grpc or http/protobuf: the setting, else the standard variables, else what the endpoint looks like
    (port 4318 or a /v1/traces path: HTTP, OTLP's conventions), else grpc (as text-embeddings-inference)."""
    if setting != "auto":
        return setting
    for name in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        value = os.environ.get(name, "").strip().lower()
        if value in ("grpc", "http/protobuf"):
            return value
    endpoint = endpoint or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or \
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or ""
    parsed = urlparse(endpoint if "://" in endpoint else f"http://{endpoint}")
    try:
        port = parsed.port
    except ValueError:
        port = None
    return "http/protobuf" if port == 4318 or parsed.path.rstrip("/").endswith("/v1/traces") else "grpc"


def _exporter(protocol: str, endpoint: str | None):
    """The SDK's OTLP exporter; without `endpoint` it reads the standard variables (endpoint, headers,
    certificates, compression, timeout)."""
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        return OTLPSpanExporter(endpoint=endpoint) if endpoint else OTLPSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    if endpoint and not urlparse(endpoint).path.strip("/"):
        endpoint = endpoint.rstrip("/") + "/v1/traces"  # a collector's base address, as the variable takes it
    return OTLPSpanExporter(endpoint=endpoint) if endpoint else OTLPSpanExporter()


class Tracing:
    """One process's trace recorder: its resource (service name, process), sampler and batch processor."""

    def __init__(self, service_name: str | None, process: str, processor, sampler: Sampler | None = None):
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope
        from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

        attributes = {"bert.process": process}
        if service_name:
            attributes["service.name"] = service_name
        elif not os.environ.get("OTEL_SERVICE_NAME") and "service.name=" not in os.environ.get(
                "OTEL_RESOURCE_ATTRIBUTES", ""):
            attributes["service.name"] = "bert-serve"
        self.resource = Resource.create(attributes)  # OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME merged in
        self.scope = InstrumentationScope("bert-serve")
        self.processor = processor
        self.sampler = sampler or Sampler.from_environment()
        self._SpanContext, self._Link, self._Kind, self._ReadableSpan = SpanContext, Link, SpanKind, ReadableSpan
        self._unset, self._error = Status(StatusCode.UNSET), lambda message: Status(StatusCode.ERROR, message)
        self._SAMPLED = TraceFlags(TraceFlags.SAMPLED)
        self._random = random.Random()

    def new_id(self, bits: int = 64) -> int:
        value = 0
        while not value:  # an all-zero id is invalid
            value = self._random.getrandbits(bits)
        return value

    def start(self, parent: TraceContext | None) -> TraceContext | None:
        """The context of a new request span under `parent` (the caller's), or None when it is not sampled."""
        trace_id = parent.trace_id if parent is not None else self.new_id(128)
        if not self.sampler.sampled(trace_id, parent):
            return None
        return TraceContext(trace_id, self.new_id())

    def record(self, name: str, context: TraceContext, parent_span_id: int | None, start_ns: int, end_ns: int,
               attributes: dict | None = None, kind: str = "internal", links: list[TraceContext] = (),
               error: str | None = None) -> None:
        """Hand a finished span to the exporter's queue. `parent_span_id` is in `context`'s trace."""
        own = self._SpanContext(context.trace_id, context.span_id, False, self._SAMPLED)
        parent = None if parent_span_id is None else \
            self._SpanContext(context.trace_id, parent_span_id, True, self._SAMPLED)
        span = self._ReadableSpan(
            name, own, parent=parent, resource=self.resource, attributes=attributes,
            links=[self._Link(self._SpanContext(c.trace_id, c.span_id, True, self._SAMPLED)) for c in links],
            kind=getattr(self._Kind, kind.upper()), start_time=start_ns, end_time=max(start_ns, end_ns),
            instrumentation_scope=self.scope,
            status=self._error(error) if error else self._unset)
        self.processor.on_end(span)

    def batch(self, requests: list[str], started: float, seconds: float, batch) -> str:
        """One span for a computed batch (`started`: time.monotonic() at its start; `batch`: the engine's
        PreparedBatch), linked to each traced request in it (their traceparents); returns its own traceparent,
        which each of those requests links back to. It is a trace of its own: it belongs to many requests' traces
        at once, and is kept whatever the sampler says (only batches that hold a sampled request get one)."""
        context = TraceContext(self.new_id(128), self.new_id())
        links = [c for c in map(parse_traceparent, requests) if c is not None]
        start_ns = wall_ns(started)
        padding = batch.padding_flops / batch.flops if batch.flops else 0.0
        self.record(BATCH_SPAN, context, None, start_ns, start_ns + int(seconds * 1e9), {
            "bert.batch.size": batch.size, "bert.batch.tokens": batch.real_tokens,
            "bert.batch.padded_tokens": batch.padded_tokens, "bert.batch.padding_fraction": round(padding, 4),
            "bert.batch.device_ms": round(seconds * 1000, 3), "bert.batch.traced_requests": len(links),
        }, links=links)
        return context.traceparent

    def shutdown(self) -> None:
        """Send what is queued, waiting at most SHUTDOWN_WAIT_S (a collector that is down must not hold up exit)."""
        done = threading.Thread(target=self.processor.shutdown, name="bert-trace-flush", daemon=True)
        done.start()
        done.join(SHUTDOWN_WAIT_S)
        if done.is_alive():
            log.warning("traces: the collector did not take the last spans within %.0f s; they are lost",
                        SHUTDOWN_WAIT_S)


def wall_ns(monotonic: float) -> int:
    """A time.monotonic() reading as wall-clock nanoseconds (what spans carry), through the clocks' offset now."""
    return time.time_ns() - int((time.monotonic() - monotonic) * 1e9)


_current: Tracing | None = None


def current() -> Tracing | None:
    """This process's Tracing (the last `setup`'s), as OpenTelemetry keeps one tracer provider a process: what the
    batcher records batches with, knowing nothing of how the process was started."""
    return _current


def setup(settings, process: str) -> Tracing | None:
    """This process's Tracing, or None when traces are off (then nothing of the SDK is imported)."""
    global _current
    _current = None
    if not tracing_wanted(settings.otlp_endpoint):
        return None
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    protocol = otlp_protocol(settings.otlp_protocol, settings.otlp_endpoint)
    processor = BatchSpanProcessor(_exporter(protocol, settings.otlp_endpoint))
    tracing = _current = Tracing(settings.otlp_service_name, process, processor)
    log.info("traces: OTLP over %s to %s, sampler %s", protocol, settings.otlp_endpoint or "the OTEL_* endpoint",
             tracing.sampler.name)
    return tracing
