"""One-sentence traffic over gRPC streams against the same over HTTP: sentences/s, latency, and the server's own CPU a
sentence (every process of the server, from /proc), with the load generators' own CPU a sentence apart (each child's
over its timed load): on one host they share the cores with the server, so the sentences/s rest on both, and a gRPC
client (grpc.aio) costs more a message than the HTTP one (bench.serving.http_client).

- http: `--clients` HTTP clients, each with its own keep-alive connection, POST /embed one sentence at a time and
  wait for each answer (bench.serving.load).
- grpc: `--clients` EmbedStream calls (tei.v1), one sentence a message, each with `--depth` messages unanswered
  (1 by default: each waits for its answer before sending the next, as an HTTP client does) (bench.serving.grpc_load).

The server: by default the nearly free model of bench.serving.server_cpu (the bundled tokenizer over a 1-layer
encoder, 384 wide, so that answers weigh what the bundled model's do): what is measured is then the cost of being a
server, which on a GPU host bounds the sentences/s (docs/processes.md). `--checkpoint bundled` serves the bundled
model instead: on a CPU the model's own compute then dominates. Rows run in turns (http, grpc, http, grpc, ...:
`--rounds`), each on a freshly started server, and the table gives each row's median run and the ratio.

    python -m bench.serving.grpc_vs_http                          # --workers 1, 64 clients, 10 s a run, 2 rounds
    python -m bench.serving.grpc_vs_http --workers 0 --seconds 3 --rounds 1 --clients 8    # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.serving import grpc_load
from bench.serving.load import drive_processes
from bench.serving.process_cpu import cpu_seconds, front_ends, process_tree
from bench.serving.server_cpu import nearly_free_checkpoint
from bench.serving.throughput import sentences
from devkit.server import free_port, start_service
from service.settings import DEFAULT_CHECKPOINT


@dataclass
class Run:
    protocol: str
    workers: int
    clients: int
    depth: int
    sentences_per_s: float
    server_cpu_ms_per_sentence: float
    frontend_cpu_ms_per_sentence: float | None  # with --workers >= 1: the front ends' share
    clients_cpu_ms_per_sentence: float  # the load generators' own (not the server's): they share the host's cores
    server_cores_busy: float
    p50_ms: float
    p99_ms: float


def measure(protocol: str, checkpoint: Path, workers: int, clients: int, depth: int, seconds: float,
            client_processes: int, texts: list[str], server_args: list[str]) -> Run:
    grpc_port = free_port()
    process, url = start_service(checkpoint, "--workers", str(workers), "--grpc-port", str(grpc_port), *server_args)
    target = f"127.0.0.1:{grpc_port}"
    counts = {t: 1 for t in texts}

    clients_cpu_s: list[float] = []  # the load generators' CPU seconds, a load each

    def load(duration: float) -> tuple[list[float], int, float]:
        if protocol == "http":
            latencies, answered, _, wall = drive_processes(url, texts, clients, duration, counts, "embed", 1,
                                                           client_processes, clients_cpu_s)
            return latencies, answered, wall
        latencies, answered, wall, width = grpc_load.drive_processes(target, texts, clients, depth, duration,
                                                                     client_processes, clients_cpu_s)
        if width <= 0:
            raise RuntimeError("the gRPC answers carried no vector")
        return latencies, answered, wall

    try:
        load(2.0)  # warm-up
        before = cpu_seconds(process_tree(process.pid))
        latencies, answered, wall = load(seconds)
        pids = process_tree(process.pid)
        after = cpu_seconds(pids)
        http = front_ends(pids)  # while they run: /proc says which they are
    finally:
        process.terminate()
        process.wait(60)
    used = {pid: after[pid] - before.get(pid, 0.0) for pid in after}
    latencies.sort()
    return Run(protocol, workers, clients, depth if protocol == "grpc" else 1, answered / wall,
               1000 * sum(used.values()) / answered,
               1000 * sum(v for pid, v in used.items() if pid in http) / answered if http else None,
               1000 * clients_cpu_s[-1] / answered, sum(used.values()) / wall, 1000 * latencies[len(latencies) // 2],
               1000 * latencies[int(len(latencies) * 0.99)])


def median_run(runs: list[Run]) -> Run:
    ordered = sorted(runs, key=lambda r: r.sentences_per_s)
    return ordered[(len(ordered) - 1) // 2]


def table(runs: list[Run]) -> str:
    lines = ["| protocol | workers | clients x depth | sentences/s | server CPU ms/sentence | front ends ms/sentence "
             "| clients ms/sentence | cores busy | p50 ms | p99 ms | runs (sentences/s) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for protocol in ("http", "grpc"):
        mine = [r for r in runs if r.protocol == protocol]
        if not mine:
            continue
        r = median_run(mine)
        front = "–" if r.frontend_cpu_ms_per_sentence is None else f"{r.frontend_cpu_ms_per_sentence:.3f}"
        lines.append(f"| {protocol} | {r.workers} | {r.clients} x {r.depth} | {r.sentences_per_s:,.0f} | "
                     f"{r.server_cpu_ms_per_sentence:.3f} | {front} | {r.clients_cpu_ms_per_sentence:.3f} | "
                     f"{r.server_cores_busy:.2f} | {r.p50_ms:.1f} | "
                     f"{r.p99_ms:.1f} | {', '.join(f'{x.sentences_per_s:,.0f}' for x in mine)} |")
    return "\n".join(lines)


def ratios(runs: list[Run]) -> dict[str, float]:
    http = median_run([r for r in runs if r.protocol == "http"])
    grpc = median_run([r for r in runs if r.protocol == "grpc"])
    return {"throughput_grpc_over_http": grpc.sentences_per_s / http.sentences_per_s,
            "cpu_per_sentence_grpc_over_http": grpc.server_cpu_ms_per_sentence / http.server_cpu_ms_per_sentence,
            "clients_cpu_per_sentence_grpc_over_http":
                grpc.clients_cpu_ms_per_sentence / http.clients_cpu_ms_per_sentence}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--clients", type=int, default=64, help="HTTP clients, and gRPC streams")
    parser.add_argument("--depth", type=int, default=1, help="messages a stream keeps unanswered")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--client-processes", type=int, default=2)
    parser.add_argument("--checkpoint", default="nearly-free", help="nearly-free (default), bundled, or a directory")
    parser.add_argument("--hidden", type=int, default=384, help="the nearly free encoder's width")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--server-args", nargs=argparse.REMAINDER, default=[], help="more flags for the service")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="grpc-vs-http-"))
    try:
        checkpoint = {"nearly-free": lambda: nearly_free_checkpoint(work / "nearly-free", args.hidden),
                      "bundled": lambda: DEFAULT_CHECKPOINT}.get(args.checkpoint, lambda: Path(args.checkpoint))()
        texts = sentences(2000, None, None)
        runs = []
        for _ in range(args.rounds):
            for protocol in ("http", "grpc"):
                runs.append(measure(protocol, checkpoint, args.workers, args.clients, args.depth, args.seconds,
                                    args.client_processes, texts, args.server_args))
                print(json.dumps(asdict(runs[-1])), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = ratios(runs)
    print(f"\n{platform.processor() or platform.machine()}, {os.cpu_count()} cores shared by the server and "
          f"{args.client_processes} load-generator processes; checkpoint {args.checkpoint}; {args.seconds:g} s a run\n")
    print(table(runs))
    print(f"\ngRPC / HTTP: {result['throughput_grpc_over_http']:.2f}x the sentences/s, "
          f"{result['cpu_per_sentence_grpc_over_http']:.2f}x the server CPU a sentence, "
          f"{result['clients_cpu_per_sentence_grpc_over_http']:.2f}x the load generators' CPU a sentence")
    if args.json:
        args.json.write_text(json.dumps({"runs": [asdict(r) for r in runs], **result}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
