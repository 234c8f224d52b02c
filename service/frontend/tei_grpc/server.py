"""text-embeddings-inference's gRPC API (tei.v1) on `--grpc-port`, served by each front end beside HTTP, over the
same runtime: its front door and engine, admission count, API key, metrics, traces and logs.

- Every call of tei.v1 is answered (`methods.RPCS`); one the loaded model cannot serve (Predict without a
  classifier, Rerank without a cross-encoder) ends FAILED_PRECONDITION, as TEI answers it; a method that is not in
  tei.v1 UNIMPLEMENTED (the gRPC library's answer). Reflection (v1alpha) and the standard health service are on;
  health says SERVING per service while the server is ready (Predict and Rerank only for a model that has them).
- Requests are plain bytes to the handlers and parsed here, so that a message that does not parse ends
  INVALID_ARGUMENT naming the call (the library's own deserializer would answer INTERNAL). Answers leave as bytes
  (`wire` writes the vectors).
- A unary call is one request: its message whole within body_timeout_s (as an HTTP body), refused with
  RESOURCE_EXHAUSTED when max_concurrent_requests are in flight (HTTP's 429). A stream's messages are computed
  concurrently, at most grpc_stream_window at once, each answered in the order sent, each holding an admission slot
  while it computes; when the server is full a stream waits (it stops reading, and HTTP/2 flow control holds its
  client back) instead of failing, as TEI's streams wait for a permit.
  The first message that fails ends the stream with its status, after the answers of every message before it.
  A stream with nothing in flight that sends nothing for keep_alive_s ends DEADLINE_EXCEEDED (a stalled client
  holds a slot of grpc's concurrent calls, max_connections a front end, not forever). `streams` runs them.
- The client's deadline is each message's too: the engine drops inputs that cannot reach the device by it. A
  call that ends early (cancelled, past its deadline) cancels what it had queued.
- Each call and each stream message gets a request record (`service.frontend.request_record`): its id (the
  client's `x-request-id` metadata, or a new one, sent back in the trailing metadata; a stream's messages are
  `<id>.<n>`), its trace (`traceparent` metadata continued; a stream is one span, each message a child with the
  spans of a request below it), its log line, and the timings of the answer's Metadata.
"""

from __future__ import annotations

import asyncio
import logging
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection

from service.errors import ServiceError
from service.frontend.api_key import MESSAGE as KEY_MESSAGE, key_matches
from service.frontend.frontdoor import FrontDoor
from service.frontend.request_record import RequestRecord
from service.frontend.runtime import Runtime
from service.frontend.tei_grpc import streams
from service.frontend.tei_grpc.errors import SERVER_FAULTS, CallError, status_of
from service.frontend.tei_grpc.methods import RPCS, SERVICES, Call, Rpc, parse
from service.frontend.tei_grpc.streams import call_metadata
from service.logs import CURRENT_REQUEST

log = logging.getLogger("service")
OK = grpc.StatusCode.OK
HEALTH_EVERY_S = 0.5  # how often the health service's statuses are brought up to date
ADMISSION_POLL_S = 0.002  # how often a stream that waits for an admission slot looks again


class GrpcFrontEnd:
    def __init__(self, runtime: Runtime, requests, reuse_port: bool):
        """`requests`: the admission count HTTP uses (this process's, or one over every front end)."""
        self.runtime = runtime
        self.settings = runtime.settings
        self.requests = requests
        self.reuse_port = reuse_port
        self.tracing = runtime.tracing
        self.server: grpc.aio.Server | None = None
        self.health = health_aio.HealthServicer()
        self._health_task: asyncio.Task | None = None
        self._statuses: dict[str, int] = {}
        self._counters: dict[tuple[str, grpc.StatusCode], tuple] = {}  # (method, code) -> its metrics' children

    # ---- life cycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        s = self.settings
        server = grpc.aio.server(
            maximum_concurrent_rpcs=s.max_connections,  # beyond: RESOURCE_EXHAUSTED from the library
            options=[("grpc.so_reuseport", 1 if self.reuse_port else 0),
                     # Up to max_body_bytes a message is refused in order (`_parse`: a stream's earlier messages
                     # are answered first); the library refuses one over twice that, ending its call at once.
                     ("grpc.max_receive_message_length", 2 * s.max_body_bytes),
                     ("grpc.max_connection_idle_ms", int(s.keep_alive_s * 1000))])
        server.add_generic_rpc_handlers(tuple(self._handlers()))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection((*SERVICES, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                                             reflection.SERVICE_NAME), server)
        host = f"[{s.host}]" if ":" in s.host else s.host
        try:
            bound = server.add_insecure_port(f"{host}:{s.grpc_port}")
        except RuntimeError as exc:
            raise RuntimeError(f"cannot serve gRPC on {host}:{s.grpc_port}: {exc}") from None
        if not bound:
            raise RuntimeError(f"cannot serve gRPC on {host}:{s.grpc_port} (is the port in use?)")
        await server.start()
        self.server = server
        await self._update_health()
        self._health_task = asyncio.create_task(self._keep_health())

    async def stop(self) -> None:
        """New calls are refused at once; those running get the queue deadline and its grace to finish."""
        if self.server is None:
            return
        if self._health_task is not None:
            self._health_task.cancel()
        await self.health.enter_graceful_shutdown()
        await self.server.stop(self.settings.queue_timeout_s + self.settings.deadline_grace_s + 1)

    async def _keep_health(self) -> None:
        while True:
            await asyncio.sleep(HEALTH_EVERY_S)
            await self._update_health()

    async def _update_health(self) -> None:
        serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
        try:
            self.runtime.health()
            ready = True
        except ServiceError:
            ready = False
        model = self.runtime.default_model  # TEI's API has no model field: it serves the default model
        door = model.frontdoor
        can = {"tei.v1.Predict": door is not None and door.num_labels > 0,
               "tei.v1.Rerank": door is not None and (model.colbert is not None
                                                      or door.num_labels == 1 and door.classifier_pairs)}
        for service in ("", *SERVICES):
            status = serving if ready and can.get(service, True) else not_serving
            if self._statuses.get(service) != status:
                self._statuses[service] = status
                await self.health.set(service, status)

    def _handlers(self):
        by_service: dict[str, dict] = {}
        for rpc in RPCS:
            if rpc.kind == "unary":  # read as a stream of one message: see _unary_handler
                handler = grpc.stream_stream_rpc_method_handler(self._unary_handler(rpc))
            elif rpc.kind == "stream":
                handler = grpc.stream_stream_rpc_method_handler(streams.answer_each(self, rpc))
            else:
                handler = grpc.stream_unary_rpc_method_handler(streams.rerank_stream(self, rpc))
            by_service.setdefault(rpc.service, {})[rpc.name] = handler
        return [grpc.method_handlers_generic_handler(service, table) for service, table in by_service.items()]

    # ---- what every call does ------------------------------------------------------------------

    def open_call(self, metadata: dict[str, str]) -> FrontDoor:
        """The key (UNAUTHENTICATED before anything else), then a ready front door (UNAVAILABLE while loading,
        draining or failed)."""
        key = self.settings.api_key
        if key is not None and not key_matches(metadata.get("authorization", ""), key):
            raise CallError(grpc.StatusCode.UNAUTHENTICATED, KEY_MESSAGE, "unauthorized")
        return self.runtime.ready_frontdoor()

    def admit(self) -> None:
        limit = self.settings.max_concurrent_requests
        if self.requests.total() >= limit:
            raise ServiceError("overloaded", f"{limit} requests are being handled already; retry later")
        self.requests.add(1)

    async def admit_waiting(self) -> None:
        limit = self.settings.max_concurrent_requests
        while self.requests.total() >= limit:
            await asyncio.sleep(ADMISSION_POLL_S)
        self.requests.add(1)

    def begin(self, rpc: Rpc, context, metadata: dict[str, str]) -> RequestRecord:
        record = RequestRecord.begin(rpc.path, metadata.get("x-request-id"), metadata.get("traceparent"),
                                     self.tracing)
        remaining = context.time_remaining()
        if remaining is not None:
            record.deadline = record.received + remaining
        context.set_trailing_metadata((("x-request-id", record.request_id),))
        return record

    def ended(self, rpc: Rpc, record: RequestRecord, code: grpc.StatusCode, kind: str | None, name: str,
               attributes: dict | None = None, request: bool = True) -> None:
        """A call or a stream's message answered: its metrics, spans and log line. `request`: False for a stream
        itself (its messages are the requests: they are counted, and have the spans of a request)."""
        if request:
            counted = self._counters.get((rpc.path, code))
            if counted is None:  # labelled once per method and code, not per message
                metrics, model = self.runtime.metrics, self.runtime.default  # gRPC serves the default model
                counted = self._counters[(rpc.path, code)] = (metrics.requests.labels(rpc.path, code.name, model),
                                                              metrics.request_seconds.labels(rpc.path, model))
            counted[0].inc()
            counted[1].observe(time.monotonic() - record.received)
            if code is not grpc.StatusCode.CANCELLED:
                self.runtime.requests.answered += 1
        if kind is not None:
            self.runtime.metrics.failures.labels(rpc.path, kind, self.runtime.default).inc()
        if record.trace is None and not self.settings.log_requests:
            return  # nothing more is kept of it
        record.finish(self.tracing, name, code.name, code in SERVER_FAULTS, {
            "rpc.system": "grpc", "rpc.service": rpc.service, "rpc.method": rpc.name,
            "rpc.grpc.status_code": code.value[0], "bert.model": self.runtime.model_name, **(attributes or {})},
            self.settings.log_requests, error=kind, children=request)

    @staticmethod
    def cancelled_code(context) -> grpc.StatusCode:
        remaining = context.time_remaining()
        return grpc.StatusCode.DEADLINE_EXCEEDED if remaining is not None and remaining <= 0 \
            else grpc.StatusCode.CANCELLED

    # ---- unary calls ---------------------------------------------------------------------------

    def _unary_handler(self, rpc: Rpc):
        """A unary call, served as a stream of one message (the two are the same on the wire): the library reads a
        unary call's message before it calls the handler, and a client that sends half of one and stalls would hold
        a call slot for as long as its connection lives; here the message must be whole within body_timeout_s, as
        an HTTP body (DEADLINE_EXCEEDED past it). It costs a unary call ~15% more of the library's CPU."""
        async def handler(request_iterator, context):
            metadata = call_metadata(context)
            record = self.begin(rpc, context, metadata)
            token = CURRENT_REQUEST.set(record)
            self.runtime.requests.accepted += 1
            admitted, answer, code, kind, message = False, None, OK, None, ""
            try:
                door = self.open_call(metadata)
                raw = await self._one_message(request_iterator)
                if rpc.computes:
                    self.admit()
                    admitted = True
                request = parse(rpc, raw, self.settings.max_body_bytes)
                answer = await rpc.answer(Call(self.runtime, door, None, record), request)
            except asyncio.CancelledError:
                code = self.cancelled_code(context)
                raise
            except Exception as exc:  # noqa: BLE001 - every failure is answered with its status (errors.py)
                code, message, kind = status_of(exc, rpc.path)
            finally:
                if admitted:
                    self.requests.add(-1)
                self.ended(rpc, record, code, kind, rpc.path[1:])
                CURRENT_REQUEST.reset(token)
            if answer is None:
                await context.abort(code, message)
            yield answer

        return handler

    async def _one_message(self, request_iterator) -> bytes:
        limit = self.settings.body_timeout_s
        try:
            return await asyncio.wait_for(anext(request_iterator), limit)
        except StopAsyncIteration:
            raise CallError(grpc.StatusCode.INVALID_ARGUMENT, "the call sent no message", "validation") from None
        except TimeoutError:
            raise ServiceError("request_timeout", f"the request message did not arrive in full within {limit:g} s "
                                                  "(body_timeout_s)") from None
