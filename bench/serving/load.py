"""The benchmarks' load generator: closed-loop HTTP clients, in this process or spread over several.

One process's event loop tops out at a few thousand requests/s, below what several front-end processes
serve on a GPU host: `drive_processes` runs `python -m bench.serving.load` children, each an asyncio loop
with its share of the clients, starting together once every child is ready, and merges what they measured.
This module imports no torch, so that a child starts in a fraction of a second.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.serving.http_client import Connection


def one_or_many(texts: list[str]) -> str | list[str]:
    """A single input is sent as a string (the common case), several as a list."""
    return texts[0] if len(texts) == 1 else texts


def encode_request(texts: list[str]) -> tuple[str, dict | None]:
    return "/encode", {"inputs": one_or_many(texts), "pooling": "mean", "truncate": True}


def live_request(texts: list[str]) -> tuple[str, dict | None]:
    """GET /live: a route that does nothing, for the load generator's own ceiling (payload None = GET)."""
    return "/live", None


def infinity_request(model: str):
    """Infinity's OpenAI-style route; it mean-pools (and normalises) as sentence-transformers does."""
    return lambda texts: ("/embeddings", {"model": model, "input": texts})


def embed_request(texts: list[str]) -> tuple[str, dict | None]:
    """TEI's /embed: the route the front-end cost benchmark (bench.serving.server_cpu) drives."""
    return "/embed", {"inputs": one_or_many(texts)}


REQUESTS = {"encode": encode_request, "embed": embed_request, "live": live_request}


def request_maker(name: str):
    """A request by name: one of REQUESTS, or (several models, bench.serving.several_models) `embed@PREFIX` (TEI's
    /embed under a path prefix such as /models/NAME), `rerank@PREFIX` (TEI's /rerank: the first input is the query,
    the rest the texts), `infinity-embed@MODEL` and `infinity-rerank@MODEL` (Infinity's routes for one of its
    models)."""
    if name in REQUESTS:
        return REQUESTS[name]
    kind, _, where = name.partition("@")
    if kind == "embed":
        return lambda texts: (where + "/embed", {"inputs": one_or_many(texts), "truncate": True})
    if kind == "rerank":
        return lambda texts: (where + "/rerank", {"query": texts[0], "texts": texts[1:], "truncate": True})
    if kind == "infinity-embed":
        return lambda texts: ("/embeddings", {"model": where, "input": texts})
    if kind == "infinity-rerank":
        return lambda texts: ("/rerank", {"model": where, "query": texts[0], "documents": texts[1:]})
    raise ValueError(f"no request named {name!r}")


async def drive(url: str, texts: list[str], concurrency: int, duration: float, token_counts: dict[str, int],
                request=encode_request, inputs_per_request: int = 1, first_client: int = 0, stride: int | None = None,
                interval_s: float = 0.0):
    """`concurrency` clients, each with its own connection, send `inputs_per_request` inputs per request
    and wait for the answer before sending the next, until time is up. (`first_client` and `stride`: this
    loop's clients among all the processes', so that each sends its own inputs.) With `interval_s`, a client sends
    at most one request per interval (at once when its last answer took longer): the same load on every server
    that keeps up, where a client that sends on each answer asks more of a faster server.

    Each client has its own keep-alive connection (bench.serving.http_client, not httpx: the load generator
    must cost little next to the server it measures; with httpx it was the bound on a GPU host).
    """
    latencies: list[float] = []
    sequences = tokens = 0
    stride = stride or concurrency
    stop_at = time.perf_counter() + duration

    async def worker(offset: int):
        nonlocal sequences, tokens
        i = offset * inputs_per_request
        async with Connection(url) as connection:
            while time.perf_counter() < stop_at:
                chosen = [texts[(i + k) % len(texts)] for k in range(inputs_per_request)]
                i += stride * inputs_per_request
                started = time.perf_counter()
                path, payload = request(chosen)
                status, body = await (connection.request("GET", path) if payload is None else
                                      connection.request("POST", path, json.dumps(payload).encode()))
                if status != 200:  # the benchmark counts only full answers; any error stops it
                    raise RuntimeError(f"{url}{path}: {status} {body[:200].decode(errors='replace')}")
                latencies.append(time.perf_counter() - started)
                if payload is not None:
                    sequences += len(chosen)
                    tokens += sum(token_counts[t] for t in chosen)
                pause = started + interval_s - time.perf_counter()
                if pause > 0:
                    await asyncio.sleep(min(pause, stop_at - time.perf_counter()))

    started = time.perf_counter()
    await asyncio.gather(*(worker(first_client + k) for k in range(concurrency)))
    seconds = time.perf_counter() - started
    return latencies, sequences, tokens, seconds


def drive_processes(url: str, texts: list[str], concurrency: int, duration: float, token_counts: dict[str, int],
                    request: str = "encode", inputs_per_request: int = 1, processes: int = 2,
                    cpu_s: list[float] | None = None):
    """As `drive`, with the clients split over `processes` child processes (`request` names one: request_maker).
    Returns the same (latencies, sequences, tokens, seconds), merged; seconds is the longest child's. `cpu_s`, when
    given, gets the children's own CPU seconds over the load (their start-up not counted) appended."""
    processes = max(1, min(processes, concurrency))
    with tempfile.TemporaryDirectory(prefix="bench-load-") as scratch:
        job = Path(scratch) / "job.json"
        job.write_text(json.dumps({"url": url, "texts": texts, "token_counts": token_counts, "request": request,
                                   "inputs_per_request": inputs_per_request, "duration": duration,
                                   "concurrency": concurrency}))
        children = [subprocess.Popen([sys.executable, "-m", "bench.serving.load", str(job), str(k), str(processes)])
                    for k in range(processes)]
        start_together(job, children)
        for child in children:
            child.wait(timeout=duration + 120)
        if any(child.returncode for child in children):
            raise RuntimeError(f"a load-generator process failed (exit codes {[c.returncode for c in children]})")
        parts = [json.loads(result_path(job, k).read_text()) for k in range(processes)]
    if cpu_s is not None:
        cpu_s.append(sum(p["cpu_s"] for p in parts))
    return ([latency for part in parts for latency in part["latencies"]], sum(p["sequences"] for p in parts),
            sum(p["tokens"] for p in parts), max(p["seconds"] for p in parts))


READY_TIMEOUT_S = 60.0  # a child's start: an interpreter and this module's imports
POLL_S = 0.002


def start_together(job: Path, children: list[subprocess.Popen]) -> None:
    """Wait until every child has said it is ready (imports done), then tell them all one start time. A fixed
    head start instead cost every row of a benchmark ~2 s of waiting, and still had to guess how long eight
    interpreters take to start on a busy host."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not all(ready_path(job, k).exists() for k in range(len(children))):
        if any(child.poll() is not None for child in children):
            break  # one died before starting: its exit code is reported by the caller
        if time.monotonic() > deadline:
            for child in children:
                child.kill()
            raise RuntimeError(f"the load-generator processes were not ready within {READY_TIMEOUT_S:.0f} s")
        time.sleep(POLL_S)
    go = job.with_name("go.tmp")
    go.write_text(json.dumps({"start_at": time.time() + 0.01}))
    go.replace(job.with_name("go.json"))  # whole or absent: a child never reads half of it


def wait_for_start(job: Path, index: int) -> None:
    ready_path(job, index).touch()
    go = job.with_name("go.json")
    while not go.exists():
        time.sleep(POLL_S)
    time.sleep(max(0.0, json.loads(go.read_text())["start_at"] - time.time()))


def ready_path(job: Path, index: int) -> Path:
    return job.with_name(f"ready-{index}")


def run_loop(main):
    """asyncio.run on uvloop where it is installed (it is wherever the service runs): a cheaper loop leaves
    more of a shared machine to the server under test."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def result_path(job: Path, index: int) -> Path:
    # A file, not stdout: uvloop leaves standard output non-blocking, and a pipe then takes 64 KiB of the JSON.
    return job.with_name(f"result-{index}.json")


def _child(job_path: str, index: int, processes: int) -> None:
    """One child of `drive_processes`: clients index, index + processes, ... of the job; JSON to result_path."""
    job = json.loads(Path(job_path).read_text())
    mine = len(range(index, job["concurrency"], processes))
    wait_for_start(Path(job_path), index)  # every child starts at once
    started = time.process_time()  # every thread of this process, from the start of the load

    async def clients():
        # client k of this child is client index + k * processes overall; `stride` spreads the inputs
        return await asyncio.gather(*(
            drive(job["url"], job["texts"], 1, job["duration"], job["token_counts"], request_maker(job["request"]),
                  job["inputs_per_request"], first_client=index + k * processes, stride=job["concurrency"])
            for k in range(mine)))

    results = run_loop(clients())
    result_path(Path(job_path), index).write_text(json.dumps({
        "latencies": [x for r in results for x in r[0]], "sequences": sum(r[1] for r in results),
        "tokens": sum(r[2] for r in results), "seconds": max(r[3] for r in results),
        "cpu_s": time.process_time() - started}))


if __name__ == "__main__":
    _child(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
