"""CPU the server spends per request when the model costs nearly nothing: the cost of being a server.

A checkpoint with the bundled tokenizer and a nearly free encoder (1 layer, hidden 32, random weights)
is served, clients send `/embed` requests of 1 or 8 sentences back to back, and the CPU time of every
process of the server (the supervisor, the engine and each HTTP front end; read from /proc) is divided
by the requests answered. The clients' own CPU is not counted. On a GPU host this is what bounds the
requests per second one process can take; the model's own cost is measured by bench.serving.

    python -m bench.serving.server_cpu --workers 0 1 2 --inputs-per-request 1 8 --concurrency 64 --seconds 10

Runs on a shared CPU move by 15-25%; `--rounds 3` measures every row three times, in turns (floor, 0, 1, 2,
then again), and reports each row's median run with the range of its CPU per request and per sentence.

The first row (workers "floor") is bare uvicorn under the same load (`bench.serving.http_floor`): what the
socket, HTTP parsing and the event loop cost before any of the service's work. `--no-floor` leaves it out.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path


from bench.serving.load import drive_processes
from bench.serving.process_cpu import cpu_seconds, front_ends, process_tree
from bench.serving.throughput import sentences
from devkit.server import free_port, start, start_service
from model import BertConfig, BertForPreTraining, WordPieceTokenizer, save_checkpoint
from service.settings import DEFAULT_CHECKPOINT



@dataclass
class Row:
    workers: int | str
    inputs_per_request: int
    concurrency: int
    requests_per_s: float
    server_cpu_ms_per_request: float
    server_cpu_ms_per_sentence: float
    server_cores_busy: float  # CPU seconds of the server per second of wall time
    p50_ms: float
    p99_ms: float
    # With --workers >= 1, the HTTP front ends' share alone: on a GPU host what bounds the sentences/s they can feed
    # the device (the engine's own CPU there is spent launching work, not on a CPU model); None with one process.
    frontend_cpu_ms_per_sentence: float | None = None


def nearly_free_checkpoint(directory: Path, hidden: int = 32) -> Path:
    """The bundled tokenizer over a 1-layer encoder `hidden` wide: at 32 its forward costs next to nothing; at 384,
    the bundled model's width, the responses weigh what the bundled model's do."""
    tokenizer = WordPieceTokenizer.load(DEFAULT_CHECKPOINT)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=hidden, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=512)
    save_checkpoint(directory, BertForPreTraining(config).eval(), tokenizer, metadata={"note": "random weights"})
    return directory


def measure(url: str, root: int, texts: list[str], concurrency: int, per_request: int, seconds: float,
            workers: int, client_processes: int) -> Row:
    counts = {t: 1 for t in texts}
    drive_processes(url, texts, concurrency, 2.0, counts, "embed", per_request, client_processes)  # warm-up
    before = cpu_seconds(process_tree(root))
    latencies, sentences_sent, _, wall = drive_processes(url, texts, concurrency, seconds, counts, "embed",
                                                         per_request, client_processes)
    pids = process_tree(root)
    after = cpu_seconds(pids)
    used = sum(after[pid] - before.get(pid, 0.0) for pid in after)  # a process that ended took its share along
    http = front_ends(pids)
    by_front_ends = sum(after[pid] - before.get(pid, 0.0) for pid in after if pid in http)
    latencies.sort()
    return Row(workers, per_request, concurrency, len(latencies) / wall, 1000 * used / len(latencies),
               1000 * used / sentences_sent, used / wall, 1000 * latencies[len(latencies) // 2],
               1000 * latencies[int(len(latencies) * 0.99)],
               1000 * by_front_ends / sentences_sent if http else None)


def table(rows: list[Row], rounds: int) -> str:
    """One line per (workers, sentences a request): its median run by CPU per request, and with several rounds
    the range of the CPU figures over them."""
    runs: dict[tuple, list[Row]] = {}
    for row in rows:
        runs.setdefault((row.workers, row.inputs_per_request), []).append(row)
    ranged = rounds > 1
    lines = ["| workers | sentences/request | requests/s | server CPU ms/request | ms/sentence | front ends ms/sentence "
             "| cores busy | p50 ms | p99 ms |" + (" ms/request, range | ms/sentence, range |" if ranged else ""),
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if ranged else "")]
    for group in runs.values():
        group.sort(key=lambda r: r.server_cpu_ms_per_request)
        r = group[(len(group) - 1) // 2]
        http = "–" if r.frontend_cpu_ms_per_sentence is None else f"{r.frontend_cpu_ms_per_sentence:.3f}"
        line = (f"| {r.workers} | {r.inputs_per_request} | {r.requests_per_s:,.0f} | {r.server_cpu_ms_per_request:.2f} "
                f"| {r.server_cpu_ms_per_sentence:.3f} | {http} | {r.server_cores_busy:.2f} | {r.p50_ms:.1f} "
                f"| {r.p99_ms:.1f} |")
        if ranged:
            line += (f" {group[0].server_cpu_ms_per_request:.2f}-{group[-1].server_cpu_ms_per_request:.2f} | "
                     f"{group[0].server_cpu_ms_per_sentence:.3f}-{group[-1].server_cpu_ms_per_sentence:.3f} |")
        lines.append(line)
    return "\n".join(lines)


def start_floor():
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "uvicorn", "bench.serving.http_floor:app", "--port", str(port),
               "--log-level", "warning", "--no-access-log"]
    return start(command, url), url


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2], help="the service's --workers values")
    parser.add_argument("--inputs-per-request", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--client-processes", type=int, default=2, help="load-generator processes")
    parser.add_argument("--no-floor", action="store_true", help="leave out bare uvicorn (the HTTP floor)")
    parser.add_argument("--rounds", type=int, default=1, help="measure every row this many times, in turns")
    parser.add_argument("--hidden", type=int, default=32,
                        help="the encoder's width, what /embed returns a sentence (384: the bundled model's)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--server-args", nargs=argparse.REMAINDER, default=[], help="more flags for the service")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="server-cpu-"))
    try:
        checkpoint = nearly_free_checkpoint(work / "nearly-free", args.hidden)
        texts = sentences(2000, None, None)
        rows = []
        for _ in range(args.rounds):
            for workers in ([] if args.no_floor else ["floor"]) + args.workers:
                process, url = start_floor() if workers == "floor" else \
                    start_service(checkpoint, "--workers", str(workers), *args.server_args)
                try:
                    for per_request in args.inputs_per_request:
                        rows.append(measure(url, process.pid, texts, args.concurrency, per_request, args.seconds,
                                            workers, args.client_processes))
                        print(json.dumps(asdict(rows[-1])), flush=True)
                finally:
                    process.terminate()
                    process.wait(60)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{platform.processor() or platform.machine()}, {os.cpu_count()} cores; {args.concurrency} clients in "
          f"{args.client_processes} processes sharing the machine with the server; server CPU counted over all its "
          f"processes; a 1-layer encoder {args.hidden} wide\n")
    print(table(rows, args.rounds))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
