"""What traces cost the service: throughput at `--clients` x `--inputs` sentences on /embed (16 x 8 by default) with
traces off, and on at 100% sampling to a local OTLP collector (over gRPC, in this process, counting what it is sent),
and optionally the service from another checkout (`--base`, the commit before traces existed) against traces off:
"off" must cost nothing measurable.

Rows run in turns (A B A B ...: base, off, on, base, off, on, `--rounds` times), each on a freshly started server
with the same flags (the bundled model by default, `--workers 0` as on a CPU), so that a drift of the shared
machine reaches every row alike; the table gives each row's runs and median, and each ratio from the medians.

    python -m bench.serving.tracing_cost                                   # off and on, 3 rounds of 20 s
    git archive <commit before> | tar -x -C /tmp/base
    python -m bench.serving.tracing_cost --base /tmp/base --rounds 2        # base, off and on
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import threading
from concurrent import futures
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.serving.load import drive_processes
from bench.serving.process_cpu import cpu_seconds, process_tree
from bench.serving.throughput import sentences
from devkit.paths import REPO_ROOT
from devkit.server import free_port, start
from service.settings import DEFAULT_CHECKPOINT


@dataclass
class Run:
    row: str  # base, off or on
    sentences_per_s: float
    p50_ms: float
    p99_ms: float
    spans_received: int  # by the collector from the run's start to the server's exit (on only)
    server_cpu_ms_per_sentence: float  # every process of the server, from /proc: less noisy than sentences/s


class SpanCounter:
    """An OTLP/gRPC trace collector that counts spans and keeps nothing."""

    def __init__(self):
        import grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

        self.count = 0
        lock = threading.Lock()
        counter = self

        class Service(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request, context):  # noqa: N802 - the protocol's name
                spans = sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
                with lock:
                    counter.count += spans
                return trace_service_pb2.ExportTraceServiceResponse()

        self.server = grpc.server(futures.ThreadPoolExecutor(2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), self.server)
        self.endpoint = f"http://127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()


def measure(row: str, repo: Path, checkpoint: Path, collector: SpanCounter, clients: int, inputs: int,
            seconds: float, client_processes: int, texts: list[str], server_args: list[str]) -> Run:
    port = free_port()
    command = [sys.executable, "-m", "service", "--checkpoint", str(checkpoint), "--port", str(port), *server_args]
    env = {key: value for key, value in os.environ.items() if not key.startswith("OTEL_")}
    if row == "on":
        command += ["--otlp-endpoint", collector.endpoint]
    url = f"http://127.0.0.1:{port}"
    process = start(command, url, env=env, cwd=repo)
    counts = {t: 1 for t in texts}
    before = collector.count
    try:
        drive_processes(url, texts, clients, 3.0, counts, "embed", inputs, client_processes)  # warm-up
        before = collector.count
        cpu_before = cpu_seconds(process_tree(process.pid))
        latencies, answered, _, wall = drive_processes(url, texts, clients, seconds, counts, "embed", inputs,
                                                       client_processes)
        cpu_after = cpu_seconds(process_tree(process.pid))
    finally:
        process.terminate()
        process.wait(60)
    received = collector.count - before  # to the server's exit, which sends what it still held
    latencies.sort()
    used = sum(after - cpu_before.get(pid, 0.0) for pid, after in cpu_after.items())
    return Run(row, answered / wall, 1000 * latencies[len(latencies) // 2],
               1000 * latencies[int(len(latencies) * 0.99)], received, 1000 * used / answered)


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def summary(runs: list[Run]) -> tuple[str, dict[str, float]]:
    rows = [r for r in ("base", "off", "on") if any(run.row == r for run in runs)]
    medians = {r: median([run.sentences_per_s for run in runs if run.row == r]) for r in rows}
    cpu = {r: median([run.server_cpu_ms_per_sentence for run in runs if run.row == r]) for r in rows}
    lines = ["| row | sentences/s (median) | runs, in order | server CPU ms a sentence (median; runs) | p50 ms | "
             "p99 ms | spans received a run |", "|---|---:|---|---|---:|---:|---:|"]
    for r in rows:
        mine = [run for run in runs if run.row == r]
        lines.append(f"| {r} | {medians[r]:.1f} | {', '.join(f'{x.sentences_per_s:.1f}' for x in mine)} | "
                     f"{cpu[r]:.2f} ({', '.join(f'{x.server_cpu_ms_per_sentence:.2f}' for x in mine)}) | "
                     f"{median([x.p50_ms for x in mine]):.0f} | {median([x.p99_ms for x in mine]):.0f} | "
                     f"{', '.join(str(x.spans_received) for x in mine)} |")
    result = {}
    if "on" in medians:
        result["on_over_off"] = medians["on"] / medians["off"]
        result["cpu_on_over_off"] = cpu["on"] / cpu["off"]
    if "base" in medians:
        result["off_over_base"] = medians["off"] / medians["base"]
        result["cpu_off_over_base"] = cpu["off"] / cpu["base"]
    return "\n".join(lines), result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--inputs", type=int, default=8, help="sentences a request")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--client-processes", type=int, default=2)
    parser.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT)
    parser.add_argument("--base", type=Path, default=None, help="a checkout of the commit before, for the base row")
    parser.add_argument("--json", type=Path, default=None)
    # float32 pinned: --dtype auto picks by the host and the commit (bfloat16 on a CPU that has it, since after the
    # base), and the rows must compute alike for their ratio to be the cost of traces
    parser.add_argument("--server-args", nargs=argparse.REMAINDER, default=["--workers", "0", "--dtype", "float32"])
    args = parser.parse_args(argv)

    collector = SpanCounter()
    texts = sentences(2000, None, None)
    rows = (["base"] if args.base else []) + ["off", "on"]
    runs = []
    try:
        for _ in range(args.rounds):
            for row in rows:
                repo = args.base.resolve() if row == "base" else REPO_ROOT
                runs.append(measure(row, repo, args.checkpoint.resolve(), collector, args.clients, args.inputs,
                                    args.seconds, args.client_processes, texts, args.server_args))
                print(json.dumps(asdict(runs[-1])), flush=True)
    finally:
        collector.server.stop(0)
    text, ratios = summary(runs)
    print(f"\n{platform.processor() or platform.machine()}, {os.cpu_count()} cores shared by the server, "
          f"{args.client_processes} load-generator processes and the collector; {args.clients} clients x "
          f"{args.inputs} sentences on /embed, {args.seconds:g} s a run; server flags {' '.join(args.server_args)}\n")
    print(text)
    print("\n" + "; ".join(f"{name.replace('_', ' ')}: {value:.3f}x" for name, value in ratios.items()))
    if args.json:
        args.json.write_text(json.dumps({"runs": [asdict(r) for r in runs], **ratios}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
