"""Traces and JSON logs of real servers, received by a real OTLP collector in this process (over gRPC and over
HTTP, decoded with the OpenTelemetry protobuf definitions): the span tree of a request under the caller's trace id,
the batch span linked both ways, the same ids in the JSON log lines; sampling; and a collector that is down, slow or
refusing, which costs the requests nothing."""

from __future__ import annotations

import gzip
import json
import os
import sys
import threading
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
import httpx
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from devkit.server import free_port, start
from service.tracing import Sampler, TraceContext, parse_traceparent

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
REQUEST_CHILDREN = {"validate", "tokenize", "queue", "inference", "write"}


class Collector:
    """Spans received, each as (resource attributes, span) with ids in hex; `behaviour`: ok, refuse (UNAVAILABLE /
    503) or hang (answers nothing for 30 s)."""

    def __init__(self, behaviour: str = "ok"):
        self.behaviour = behaviour
        self.release = threading.Event()  # set at the end: a hanging collector lets go
        self.spans: list[tuple[dict, object]] = []
        self.lock = threading.Lock()
        self.requests = 0

    def take(self, request: trace_service_pb2.ExportTraceServiceRequest) -> bool:
        """Record an export; False when this collector refuses it."""
        self.requests += 1
        if self.behaviour == "hang":
            self.release.wait(30)
        if self.behaviour != "ok":
            return False
        with self.lock:
            for resource_spans in request.resource_spans:
                resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    self.spans.extend((resource, span) for span in scope_spans.spans)
        return True

    def of_trace(self, trace_hex: str) -> list:
        with self.lock:
            return [(r, s) for r, s in self.spans if s.trace_id.hex() == trace_hex]

    def wait_for(self, check, timeout_s: float = 20.0):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = check()
            if found:
                return found
            time.sleep(0.1)
        raise AssertionError(f"not received within {timeout_s} s; {len(self.spans)} spans in all")


def grpc_collector(collector: Collector):
    class Service(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request, context):
            if not collector.take(request):
                context.abort(grpc.StatusCode.UNAVAILABLE, "the collector refuses")
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"http://127.0.0.1:{port}"


def http_collector(collector: Collector):
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - the library's name
            body = self.rfile.read(int(self.headers["content-length"]))
            if self.headers.get("content-encoding") == "gzip":
                body = gzip.decompress(body)
            accepted = self.path == "/v1/traces" and collector.take(
                trace_service_pb2.ExportTraceServiceRequest.FromString(body))
            self.send_response(200 if accepted else 503)
            self.send_header("content-type", "application/x-protobuf")
            self.end_headers()
            self.wfile.write(trace_service_pb2.ExportTraceServiceResponse().SerializeToString() if accepted else b"")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def serve(checkpoint, endpoint: str, *flags: str, **env: str):
    port, grpc_port = free_port(), free_port()
    command = [sys.executable, "-m", "service", "--checkpoint", str(checkpoint), "--port", str(port),
               "--grpc-port", str(grpc_port), "--otlp-endpoint", endpoint, "--log-format", "json", "--log-requests",
               *flags]
    process = start(command, f"http://127.0.0.1:{port}",
                    env={**os.environ, "OTEL_BSP_SCHEDULE_DELAY": "100", "OTEL_EXPORTER_OTLP_TIMEOUT": "2", **env})
    return process, f"http://127.0.0.1:{port}", f"127.0.0.1:{grpc_port}"


def stop(process) -> str:
    """Stop the server; its log."""
    process.terminate()
    process.wait(60)
    return process.log_path.read_text()


def json_lines(log: str) -> list[dict]:
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    assert all(set(line) >= {"time", "level", "message", "process"} for line in lines)
    return lines


def check_request_tree(spans: list, name: str, collector: Collector) -> dict:
    """The request span under the caller's span, its five children, and the batch it ran in linked both ways."""
    by_name = {span.name: span for _, span in spans}
    request = by_name[name]
    assert request.parent_span_id.hex() == CALLER_SPAN and request.kind == request.SPAN_KIND_SERVER
    children = {span.name: span for _, span in spans if span.parent_span_id == request.span_id}
    assert set(children) == REQUEST_CHILDREN, set(children)
    order = [children[n].start_time_unix_nano for n in ("validate", "tokenize", "queue", "inference", "write")]
    assert order == sorted(order) and request.start_time_unix_nano <= order[0]
    assert children["write"].end_time_unix_nano <= request.end_time_unix_nano
    attributes = {a.key: a.value for a in request.attributes}
    assert attributes["bert.inputs"].int_value >= 1 and attributes["bert.tokens"].int_value >= 3
    links = children["inference"].links  # one per batch the request ran in (on a CPU its inputs may split)
    assert 1 <= len(links) <= attributes["bert.inputs"].int_value
    sizes = 0
    for batch_link in links:
        batch = collector.wait_for(lambda: [s for _, s in collector.of_trace(batch_link.trace_id.hex())
                                            if s.span_id == batch_link.span_id])[0]
        assert batch.name == "batch"
        batch_attributes = {a.key: a.value for a in batch.attributes}
        assert batch_attributes["bert.batch.size"].int_value >= 1 and batch_attributes["bert.batch.tokens"].int_value >= 3
        assert "bert.batch.padding_fraction" in batch_attributes
        assert batch_attributes["bert.batch.device_ms"].double_value > 0
        assert any(link.span_id == request.span_id and link.trace_id.hex() == CALLER_TRACE for link in batch.links)
        sizes += batch_attributes["bert.batch.size"].int_value
    assert sizes >= attributes["bert.inputs"].int_value  # every input ran in a linked batch
    return attributes


@pytest.mark.parametrize("workers", ["2", "0"])
def test_a_request_and_a_grpc_call_show_their_span_tree_under_the_callers_trace(tiny_checkpoint, workers):
    collector = Collector()
    receiver, endpoint = grpc_collector(collector)
    process, url, target = serve(tiny_checkpoint, endpoint, "--workers", workers)
    try:
        traceparent = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"
        response = httpx.post(url + "/embed", json={"inputs": ["a river flows", "the storm moved north"]},
                              headers={"traceparent": traceparent, "x-request-id": "client-id-1"})
        assert response.status_code == 200 and response.headers["x-request-id"] == "client-id-1"
        spans = collector.wait_for(lambda: (s := collector.of_trace(CALLER_TRACE)) and
                                   {x.name for _, x in s} >= {"POST /embed", *REQUEST_CHILDREN} and s)
        attributes = check_request_tree(spans, "POST /embed", collector)
        assert attributes["http.route"].string_value == "/embed" and attributes["bert.inputs"].int_value == 2
        assert attributes["http.response.status_code"].int_value == 200
        processes = {r["bert.process"] for r, _ in spans}
        assert processes <= ({"server"} if workers == "0" else {"front-end-0", "front-end-1"}), processes
        assert all(r["service.name"] == "bert-serve" for r, _ in spans)
        # The same over gRPC, the trace context in the call's metadata.
        with grpc.insecure_channel(target) as channel:
            raw = channel.unary_unary("/tei.v1.Embed/Embed")
            _, call = raw.with_call(b"\x0a\x0da crane flies", metadata=(("traceparent", traceparent),
                                                                      ("x-request-id", "client-id-2")))
            assert dict(call.trailing_metadata())["x-request-id"] == "client-id-2"
        spans = collector.wait_for(lambda: (s := collector.of_trace(CALLER_TRACE)) and
                                   "tei.v1.Embed/Embed" in {x.name for _, x in s} and s)
        check_request_tree(spans, "tei.v1.Embed/Embed", collector)
        request_trace = collector.of_trace(CALLER_TRACE)
        # The batch span came from the engine process (--workers 2) or the one process (--workers 0).
        batches = [r["bert.process"] for r, s in collector.spans if s.name == "batch"]
        assert set(batches) == ({"engine"} if workers == "2" else {"server"})
        assert len(request_trace) >= 12
    finally:
        log = stop(process)
        receiver.stop(0)
    lines = json_lines(log)
    mine = [line for line in lines if line.get("request_id") == "client-id-1"]
    assert mine and all(line["trace_id"] == CALLER_TRACE and line["route"] == "/embed" for line in mine)
    assert any(line.get("status") == "200" and line["duration_ms"] > 0 for line in mine)
    grpc_line = [line for line in lines if line.get("request_id") == "client-id-2"]
    assert grpc_line and grpc_line[0]["trace_id"] == CALLER_TRACE and grpc_line[0]["status"] == "OK"
    assert grpc_line[0]["route"] == "/tei.v1.Embed/Embed"


def test_traces_over_otlp_http_and_sampling(tiny_checkpoint):
    """OTLP over HTTP; a caller's unsampled trace (flags 00) stays unsampled under the default parent-based sampler,
    and a request without a caller starts its own sampled trace."""
    collector = Collector()
    receiver, endpoint = http_collector(collector)
    process, url, _ = serve(tiny_checkpoint, endpoint, "--workers", "0", "--otlp-protocol", "http/protobuf")
    try:
        unsampled = "1" * 32
        assert httpx.post(url + "/embed", json={"inputs": "no trace here"},
                          headers={"traceparent": f"00-{unsampled}-{CALLER_SPAN}-00"}).status_code == 200
        response = httpx.post(url + "/embed", json={"inputs": "a trace of its own"},
                              headers={"x-request-id": "no-caller"})
        assert response.status_code == 200
        traced = httpx.post(url + "/embed", json={"inputs": "a river flows"},
                            headers={"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"})
        assert traced.status_code == 200
        spans = collector.wait_for(lambda: (s := collector.of_trace(CALLER_TRACE)) and
                                   {x.name for _, x in s} >= {"POST /embed", *REQUEST_CHILDREN} and s)
        check_request_tree(spans, "POST /embed", collector)
        assert collector.of_trace(unsampled) == []
        own = collector.wait_for(lambda: [s for _, s in collector.spans if s.name == "POST /embed" and any(
            a.key == "bert.request_id" and a.value.string_value == "no-caller" for a in s.attributes)])
        assert own[0].parent_span_id == b"" and own[0].trace_id.hex() != CALLER_TRACE
    finally:
        stop(process)
        receiver.shutdown()


@pytest.mark.parametrize("behaviour", ["down", "refuse", "hang"])
def test_a_collector_down_refusing_or_hanging_costs_the_requests_nothing(tiny_checkpoint, behaviour):
    collector = Collector(behaviour if behaviour != "down" else "ok")
    if behaviour == "down":
        receiver, endpoint = None, f"http://127.0.0.1:{free_port()}"  # nothing listens there
    else:
        receiver, endpoint = grpc_collector(collector)
    # A small queue, so that it fills during the test: the spans beyond it are dropped, not waited for.
    process, url, _ = serve(tiny_checkpoint, endpoint, "--workers", "2", OTEL_BSP_MAX_QUEUE_SIZE="64",
                            OTEL_BSP_MAX_EXPORT_BATCH_SIZE="16")
    try:
        latencies = []
        with httpx.Client(base_url=url, timeout=30) as client:
            for i in range(120):
                started = time.perf_counter()
                response = client.post("/embed", json={"inputs": [f"sentence {i}", "another one"]},
                                       headers={"traceparent": f"00-{i + 1:032x}-{CALLER_SPAN}-01"})
                latencies.append(time.perf_counter() - started)
                assert response.status_code == 200
        latencies.sort()
        assert latencies[-1] < 2.0, latencies[-5:]  # no request waited on the collector (its timeout is 2 s)
        if behaviour != "down":
            assert collector.requests >= 1 and collector.spans == []  # it was tried, and nothing was taken
    finally:
        collector.release.set()
        log = stop(process)
        if receiver is not None:
            receiver.stop(0)
    exporter_lines = [line for line in json_lines(log) if line["logger"].startswith("opentelemetry")]
    assert exporter_lines, "the failed exports were not logged"


def test_traceparent_parsing_follows_w3c():
    context = parse_traceparent(f"00-{CALLER_TRACE}-{CALLER_SPAN}-01")
    assert context == TraceContext(int(CALLER_TRACE, 16), int(CALLER_SPAN, 16), True)
    assert context.traceparent == f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"
    assert parse_traceparent(f"00-{CALLER_TRACE}-{CALLER_SPAN}-00").sampled is False
    assert parse_traceparent(f"01-{CALLER_TRACE}-{CALLER_SPAN}-01-future").sampled  # a later version may add fields
    for bad in ("", "garbage", f"ff-{CALLER_TRACE}-{CALLER_SPAN}-01", f"00-{'0' * 32}-{CALLER_SPAN}-01",
                f"00-{CALLER_TRACE}-{'0' * 16}-01", f"00-{CALLER_TRACE}-{CALLER_SPAN}-01-extra",
                f"00-{CALLER_TRACE[:-1]}g-{CALLER_SPAN}-01", f"00-{CALLER_TRACE}-{CALLER_SPAN}"):
        assert parse_traceparent(bad) is None, bad


def test_the_sampler_reads_the_standard_names():
    ids = range(1, 1 << 64, (1 << 64) // 1000)
    assert sum(Sampler("traceidratio", "0.25").sampled(i, None) for i in ids) in range(240, 261)
    assert not any(Sampler("always_off").sampled(i, None) for i in ids)
    parent_on, parent_off = TraceContext(1, 2, True), TraceContext(1, 2, False)
    ratio = Sampler("parentbased_traceidratio", "0")
    assert ratio.sampled(5, parent_on) and not ratio.sampled(5, parent_off) and not ratio.sampled(5, None)
    default = Sampler("parentbased_always_on")
    assert default.sampled(5, None) and not default.sampled(5, parent_off)
    assert Sampler("always_on").sampled(5, parent_off)  # not parent-based: the caller's decision does not count
    assert Sampler("nonsense").name == "parentbased_always_on"
    assert Sampler("traceidratio", "2.5").bound == 1 << 64  # out of range: everything, with a warning
