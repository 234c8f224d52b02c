"""One query at a time on a CPU: this service beside Infinity's ONNX Runtime int8, in one run.

Search traffic on a CPU is a few clients with one short sentence each, and what they feel is the latency. For
each model (all-MiniLM-L6-v2 and the bundled one) every server runs at once — ours in each --dtype and Infinity's
optimum engine on `model_quantized.onnx` — and each cell (a load, a client) measures them one after the other,
in an order that rotates from cell to cell, so that a busy neighbour on a shared machine touches them alike. Two
clients: the project's load generator (bench.serving.load: ours on /encode, Infinity on /embeddings) and a plain
keep-alive client (http.client, one connection and thread per client), both on the OpenAI route /embeddings.
Then the engine in-process at batches of 1 and 4 against ONNX Runtime's int8 session on the same sentences.

    python -m bench.serving.one_query --infinity .venv-peers/bin/infinity_emb            # ~12 min on 2 cores
    python -m bench.serving.one_query --duration 10 --repeats 3 ...                       # steadier figures
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import shlex
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import torch

from bench.serving.load import drive
from bench.serving.throughput import count_tokens, parse_load, sentences, server_command
from devkit.paths import minilm_dir
from devkit.server import free_port, start
from service.settings import DEFAULT_CHECKPOINT

PEER = "infinity:optimum-int8"
CLIENTS = ("load generator", "plain keep-alive")


@dataclass
class Cell:
    """One system at one load through one client; repeats pool their requests."""

    model: str
    system: str
    client: str
    concurrency: int
    inputs_per_request: int
    latencies: list[float] = field(default_factory=list)
    sequences: int = 0
    seconds: float = 0.0

    @property
    def rate(self) -> float:
        return self.sequences / self.seconds if self.seconds else 0.0

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.latencies, q)) * 1000 if self.latencies else float("nan")


def openai_request(texts: list[str]) -> tuple[str, dict]:
    return "/embeddings", {"model": "m", "input": texts}


def plain_client(url: str, texts: list[str], concurrency: int, duration: float, per_request: int):
    """`concurrency` threads, each with one keep-alive http.client connection, POST /embeddings in a closed loop."""
    parts = urlsplit(url)
    latencies: list[float] = []
    counts = [0] * concurrency
    errors: list[str] = []
    stop_at = time.perf_counter() + duration

    def client(k: int) -> None:
        connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
        i = k * per_request
        try:
            while time.perf_counter() < stop_at and not errors:
                chosen = [texts[(i + n) % len(texts)] for n in range(per_request)]
                i += concurrency * per_request
                body = json.dumps({"model": "m", "input": chosen})
                started = time.perf_counter()
                connection.request("POST", "/embeddings", body, {"Content-Type": "application/json"})
                answer = connection.getresponse()
                data = answer.read()
                if answer.status != 200:
                    errors.append(f"{answer.status} {data[:200]!r}")
                    return
                latencies.append(time.perf_counter() - started)  # list.append is atomic under the GIL
                counts[k] += len(chosen)
        finally:
            connection.close()

    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise RuntimeError(f"{url}/embeddings: {errors[0]}")
    return latencies, sum(counts), time.perf_counter() - started


def measure(cell: Cell, url: str, request, texts: list[str], token_counts: dict, duration: float) -> None:
    if cell.client == "load generator":
        latencies, sequences, _, seconds = asyncio.run(drive(url, texts, cell.concurrency, duration, token_counts,
                                                             request, cell.inputs_per_request))
    else:
        latencies, sequences, seconds = plain_client(url, texts, cell.concurrency, duration, cell.inputs_per_request)
    cell.latencies += latencies
    cell.sequences += sequences
    cell.seconds += seconds


def serve_all(systems: list[str], checkpoint: Path, infinity: str | None, work: Path):
    """Start every system's server for `checkpoint`; {system: (process, url, the load generator's request)}."""
    servers = {}
    try:
        for system in systems:
            port = free_port()
            command, request = server_command(system, checkpoint, port, infinity, work)
            url = f"http://127.0.0.1:{port}"
            servers[system] = (start(command, url, timeout_s=300), url, request)
    except BaseException:  # one failed to start: the ones already up go too
        for process, _, _ in servers.values():
            process.terminate()
            process.wait(timeout=60)
        raise
    return servers


def run_model(label: str, checkpoint: Path, args, work: Path) -> list[Cell]:
    from model import load_checkpoint

    tokenizer = load_checkpoint(checkpoint).tokenizer
    texts = sentences(args.sentences, None, tokenizer)
    token_counts = count_tokens(tokenizer, texts)
    systems = [f"service:{dtype}" for dtype in args.dtypes] + ([PEER] if args.infinity else [])
    servers = serve_all(systems, checkpoint, args.infinity, work)
    cells: dict[tuple, Cell] = {}
    try:
        for system, (_, url, request) in servers.items():  # warm-up: first calls, caches, kernels compiled
            asyncio.run(drive(url, texts[:64], 4, args.warm_up, token_counts, request, 1))
        turn = 0
        for repeat in range(args.repeats):
            for concurrency, per_request in args.loads:
                for client in args.clients:
                    turn += 1
                    order = systems[turn % len(systems):] + systems[:turn % len(systems)]
                    for system in order:
                        _, url, request = servers[system]
                        key = (system, client, concurrency, per_request)
                        cell = cells.setdefault(key, Cell(label, system, client, concurrency, per_request))
                        measure(cell, url, request if client == "load generator" else openai_request, texts,
                                token_counts, args.duration)
                    print(f"  {label} {concurrency}x{per_request} {client}: " + ", ".join(
                        f"{s} {cells[(s, client, concurrency, per_request)].rate:.0f}/s" for s in systems),
                        file=sys.stderr, flush=True)
    finally:
        for process, _, _ in servers.values():
            process.terminate()
        for process, _, _ in servers.values():
            process.wait(timeout=60)
    return list(cells.values())


def in_process(checkpoint: Path, work: Path, seconds: float, dtypes: list[str]) -> dict[str, dict[str, float]]:
    """ms per sentence, median over single calls: {"batch B, T thread(s)": {system: ms}}, the engine as the service
    builds it (each dtype) and ONNX Runtime's int8 session (Infinity's file: per-tensor dynamic int8)."""
    import onnxruntime

    from bench.precision.onnx_export import export_onnx, quantize_onnx
    from bench.precision.variants import padded
    from model import load_checkpoint
    from model.device import keep_freed_memory
    from service.engine.loader import build_engine
    from service.engine.precision import choose
    from service.tasks import EncodeItem

    keep_freed_memory()
    loaded = load_checkpoint(checkpoint)
    encoded = loaded.tokenizer.encode_batch(sentences(200, None, loaded.tokenizer), truncate=True)
    items = [EncodeItem(e.ids, e.type_ids, pooling="mean") for e in encoded]
    cpu = torch.device("cpu")
    # A checkpoint per engine: int8 quantizes the model it is given in place (kernels.quantize)
    engines = {f"ours {d}": build_engine(load_checkpoint(checkpoint), cpu, choose(d, cpu)) for d in dtypes}
    onnx_path = quantize_onnx(export_onnx(checkpoint, work / "export"), per_channel=False)
    cores = torch.get_num_threads()

    def session(threads: int):
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        return onnxruntime.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])

    def ort_run(runner, batch):
        input_ids, mask = padded([i.input_ids for i in batch])
        hidden = runner.run(None, {"input_ids": input_ids.numpy(), "attention_mask": mask.numpy()})[0]
        weights = mask.numpy()[..., None].astype(np.float32)
        return (hidden * weights).sum(1) / weights.sum(1)

    def per_sentence(run, size: int) -> float:
        batches = [items[i:i + size] for i in range(0, len(items) - size + 1, size)]
        run(batches[0])
        times, k, begun = [], 0, time.perf_counter()
        while time.perf_counter() - begun < seconds:
            batch = batches[k % len(batches)]
            k += 1
            started = time.perf_counter()
            run(batch)
            times.append(time.perf_counter() - started)
        return float(np.median(times)) * 1000 / size

    results: dict[str, dict[str, float]] = {}
    threads_before = torch.get_num_threads()
    try:
        for threads in sorted({1, cores}):
            torch.set_num_threads(threads)
            ort = session(threads)
            for size in (1, 4):
                row = {"ONNX Runtime int8": per_sentence(lambda b: ort_run(ort, b), size)}
                for name, engine in engines.items():
                    row[name] = per_sentence(lambda b, e=engine: e.run(e.collate(b)), size)
                results[f"batch {size}, {threads} thread{'s' * (threads > 1)}"] = row
    finally:
        torch.set_num_threads(threads_before)
    return results


def ratio_table(cells: list[Cell], model: str, dtypes: list[str], loads, clients) -> list[str]:
    by = {(c.system, c.client, c.concurrency, c.inputs_per_request): c for c in cells if c.model == model}
    lines = [f"**{model}**", "", "| load | client | ours int8 seq/s | Infinity ONNX int8 seq/s | ratio | "
             "p50 ms ours / Inf. | p99 ms ours / Inf. | " + " | ".join(f"{d} seq/s" for d in dtypes if d != "int8")
             + " |", "|---|---|---:|---:|---:|---:|---:|" + "---:|" * (len(dtypes) - ("int8" in dtypes))]
    for concurrency, per_request in loads:
        for client in clients:
            ours, peer = by.get(("service:int8", client, concurrency, per_request)), \
                by.get((PEER, client, concurrency, per_request))
            if ours is None:
                continue
            ratio = f"**{ours.rate / peer.rate:.2f}×**" if peer and peer.rate else "–"
            load = f"{concurrency}" if per_request == 1 else f"{concurrency} × {per_request}"
            others = " | ".join(f"{by[(f'service:{d}', client, concurrency, per_request)].rate:.0f}"
                                for d in dtypes if d != "int8")
            lines.append(f"| {load} | {client} | {ours.rate:.0f} | {peer.rate:.0f} | {ratio} | "
                         f"{ours.percentile(50):.1f} / {peer.percentile(50):.1f} | "
                         f"{ours.percentile(99):.1f} / {peer.percentile(99):.1f} | {others} |" if peer else
                         f"| {load} | {client} | {ours.rate:.0f} | – | – | {ours.percentile(50):.1f} / – | "
                         f"{ours.percentile(99):.1f} / – | {others} |")
    return lines


def verdicts(cells: list[Cell], model: str) -> list[str]:
    """The issue's targets, each met or not, from the load generator's cells."""
    def cell(system, concurrency, per_request=1, client="load generator"):
        return next((c for c in cells if (c.model, c.system, c.client, c.concurrency, c.inputs_per_request)
                     == (model, system, client, concurrency, per_request)), None)

    ours = {(c.concurrency, c.inputs_per_request): c for c in cells
            if c.model == model and c.system == "service:int8" and c.client == "load generator"}
    peer = {key: cell(PEER, *key) for key in ours}
    if not all(peer.values()):
        return []
    ratio = {key: ours[key].rate / peer[key].rate for key in ours}
    one, four = ours.get((1, 1)), ours.get((4, 1))
    checks = [("≥ 1.2× at 1 and 4 clients", None if one is None or four is None else
               ratio[(1, 1)] >= 1.2 and ratio[(4, 1)] >= 1.2),
              ("≥ 1× at every load up to 64", all(r >= 1 for (c, _), r in ratio.items() if c <= 64)),
              ("≥ 2.5× at 16 × 8", ratio[(16, 8)] >= 2.5 if (16, 8) in ratio else None),
              ("p50 at 1 client ≤ Infinity's", None if one is None else
               one.percentile(50) <= peer[(1, 1)].percentile(50)),
              ("p99 at 4 clients ≤ Infinity's", None if four is None else
               four.percentile(99) <= peer[(4, 1)].percentile(99))]
    shown = {True: "met", False: "**not met**", None: "not measured in this run"}
    return [f"- {name}: {shown[met]}" for name, met in checks]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.serving.one_query", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["minilm", "bundled"],
                        help="minilm (all-MiniLM-L6-v2), bundled (the service's default checkpoint), or a directory")
    parser.add_argument("--dtypes", nargs="+", default=["int8", "float32", "bfloat16"])
    parser.add_argument("--load", nargs="+", default=["1x1", "4x1", "16x1", "64x1", "16x8"], metavar="CxI",
                        help="CONCURRENCYxINPUTS_PER_REQUEST")
    parser.add_argument("--clients", nargs="+", default=list(CLIENTS), choices=CLIENTS)
    parser.add_argument("--duration", type=float, default=2.5, help="seconds per cell and repeat")
    parser.add_argument("--repeats", type=int, default=1, help="passes over every cell (their requests pooled)")
    parser.add_argument("--warm-up", type=float, default=2.0, help="seconds of 4 clients per server before measuring")
    parser.add_argument("--sentences", type=int, default=2000)
    parser.add_argument("--in-process-seconds", type=float, default=2.0)
    parser.add_argument("--infinity", default=shutil.which("infinity_emb"),
                        help="the infinity_emb command (make bench-report installs it in .venv-peers)")
    parser.add_argument("--json", type=Path, default=None, help="also write every cell here")
    parser.add_argument("--in-process-only", action="store_true", help="only the in-process comparison (no servers)")
    args = parser.parse_args(argv)
    args.loads = [parse_load(load) for load in args.load]
    if "int8" not in args.dtypes:
        parser.error("--dtypes must include int8 (the row compared with Infinity)")
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="bench-one-query-"))
    named = {"minilm": ("all-MiniLM-L6-v2", minilm_dir()), "bundled": ("bundled model", Path(DEFAULT_CHECKPOINT))}
    from bench.report.build import machine
    from model.provenance import portable_text

    host = machine()
    command = portable_text("python -m bench.serving.one_query " + shlex.join(argv if argv is not None else sys.argv[1:]))
    print(f"Measured {host['date']} on {host['cpu']}, {host['cores']} cores, torch {host['torch']}:\n`{command}`\n"
          f"({args.duration:g} s per cell and repeat, {args.repeats} repeat(s); ratio = ours int8 / Infinity)\n",
          flush=True)
    cells: list[Cell] = []
    in_proc = {}
    for model in args.models:  # each model's tables as soon as it is measured
        label, checkpoint = named.get(model, (model, Path(model)))
        mine = [] if args.in_process_only else run_model(label, checkpoint, args, work / label.replace(" ", "-"))
        cells += mine
        in_proc[label] = in_process(checkpoint, work / label.replace(" ", "-"), args.in_process_seconds, args.dtypes)
        if mine:
            print("\n".join(ratio_table(cells, label, args.dtypes, args.loads, args.clients)))
            print("\nTargets (load generator):\n" + "\n".join(verdicts(cells, label)) + "\n")
        print(f"In-process, ms per sentence ({label}):\n")
        rows = in_proc[label]
        names = list(next(iter(rows.values())))
        print("| batch, threads | " + " | ".join(names) + " | ours int8 / ORT int8 |\n|---|" + "---:|" * (len(names) + 1))
        for setting, row in rows.items():
            print(f"| {setting} | " + " | ".join(f"{row[n]:.2f}" for n in names) +
                  f" | {row['ours int8'] / row['ONNX Runtime int8']:.2f} |")
        print(flush=True)
    print(f"(the whole run: {(time.perf_counter() - started) / 60:.1f} min)")
    if args.json:
        args.json.write_text(json.dumps({"cells": [asdict(c) for c in cells], "in_process": in_proc}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
