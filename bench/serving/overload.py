"""Overload burst: measure the service's capacity, then offer 10x that for 30 s on loopback.

Every request must be answered (200; 429 with Retry-After; 503 past a queue deadline), none may hang
or get another 5xx, memory must stay bounded (peak RSS of the server), accepted requests must keep a
bounded p99, and single-request latency must be back to normal within seconds after the burst.

    python -m bench.serving.overload --checkpoint checkpoints/minilm-wikipedia --seconds 30 --factor 10
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np

from bench.serving.throughput import percentile_ms
from devkit.server import start_service
from service.settings import DEFAULT_CHECKPOINT

# Eight inputs of ~60 words each: heavy requests, so that 10x capacity is a rate one load-generator process
# on the same machine can actually offer.
PAYLOAD = {"inputs": [f"sentence {i} " + "the river flows past the old mill and into the sea " * 6 for i in range(8)],
           "pooling": "mean", "truncate": True}
CLIENTS = 32


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def closed_loop(client: httpx.AsyncClient, seconds: float, concurrency: int) -> float:
    """Requests per second the service sustains with `concurrency` clients waiting for each answer."""
    done = 0
    stop_at = time.perf_counter() + seconds

    async def worker():
        nonlocal done
        while time.perf_counter() < stop_at:
            response = await client.post("/encode", json=PAYLOAD)
            response.raise_for_status()
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done / (time.perf_counter() - started)


async def single_latency_ms(client: httpx.AsyncClient, count: int = 10) -> float:
    times = []
    for _ in range(count):
        started = time.perf_counter()
        (await client.post("/encode", json=PAYLOAD)).raise_for_status()
        times.append(time.perf_counter() - started)
    return float(np.median(times)) * 1000


async def burst(url: str, rate: float, seconds: float, timeout_s: float) -> dict:
    """Open loop: a new request every 1/rate s, whatever happened to the earlier ones."""
    statuses: Counter[str] = Counter()
    accepted_latencies: list[float] = []
    refused_latencies: list[float] = []
    problems: list[str] = []
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=32)
    # Many clients, each with its share of the connections: one httpx pool costs O(connections) per
    # request, and with hundreds open at once the load generator itself would fall behind its schedule.
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(httpx.AsyncClient(base_url=url, timeout=timeout_s, limits=limits))
                   for _ in range(CLIENTS)]

        async def one(index: int):
            started = time.perf_counter()
            try:
                response = await clients[index % CLIENTS].post("/encode", json=PAYLOAD)
            except httpx.TimeoutException:
                statuses["timeout"] += 1
                return
            except httpx.TransportError as exc:
                statuses["transport error"] += 1
                problems.append(repr(exc))
                return
            statuses[str(response.status_code)] += 1
            if response.status_code == 200:
                accepted_latencies.append(time.perf_counter() - started)
            else:
                refused_latencies.append(time.perf_counter() - started)
            if response.status_code == 429 and "retry-after" not in response.headers:
                problems.append("429 without Retry-After")
            elif response.status_code not in (200, 429, 503):
                problems.append(f"{response.status_code}: {response.text[:200]}")

        tasks = []
        started = time.perf_counter()
        sent = 0
        while (elapsed := time.perf_counter() - started) < seconds:
            due = int(elapsed * rate) + 1
            while sent < due:
                tasks.append(asyncio.ensure_future(one(sent)))
                sent += 1
            await asyncio.sleep(0.002)
        offered_s = time.perf_counter() - started
        await asyncio.gather(*tasks)
    return {
        "sent": sent,
        "offered_per_s": sent / offered_s,
        "statuses": dict(statuses),
        "accepted_p50_ms": percentile_ms(accepted_latencies, 50),
        "accepted_p99_ms": percentile_ms(accepted_latencies, 99),
        "refused_p50_ms": percentile_ms(refused_latencies, 50),
        "refused_p99_ms": percentile_ms(refused_latencies, 99),
        "problems": problems[:10],
    }


async def run(url: str, pid: int, seconds: float, factor: float) -> dict:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        await closed_loop(client, 1.0, 4)  # warm-up
        capacity = await closed_loop(client, 4.0, 8)
        quiet_ms = await single_latency_ms(client)
    result = await burst(url, factor * capacity, seconds, timeout_s=60)
    burst_ended = time.perf_counter()
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        # Back to normal: the first moment single-request latency is within 2x of the quiet figure.
        while True:
            after_ms = await single_latency_ms(client, count=3)
            recovered_s = time.perf_counter() - burst_ended
            if after_ms <= 2 * quiet_ms or recovered_s > 60:
                break
        health = (await client.get("/health")).status_code
    return {"capacity_per_s": capacity, "factor": factor, "seconds": seconds, **result,
            "quiet_latency_ms": quiet_ms, "latency_after_ms": after_ms, "recovered_after_s": recovered_s,
            "health_after": health, "server_peak_rss_mib": peak_rss_mib(pid)}


def measure(checkpoint: Path, seconds: float, factor: float, server_flags: list[str]) -> dict:
    """Start the service with `server_flags`, run the burst against it, stop it; the figures."""
    process, url = start_service(checkpoint, *server_flags)
    try:
        result = asyncio.run(run(url, process.pid, seconds, factor))
    finally:
        process.terminate()
        process.wait(timeout=60)
    result["server_flags"] = server_flags
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--factor", type=float, default=10.0, help="offered load as a multiple of capacity")
    parser.add_argument("--server-args", nargs=argparse.REMAINDER, default=[],
                        help="extra flags for python -m service (after everything else)")
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.checkpoint, args.seconds, args.factor, args.server_args), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
