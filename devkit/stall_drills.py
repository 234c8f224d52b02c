"""Drills of slow clients and a stuck engine against a real `--workers 2` server on loopback, with the service's
default settings and the bundled model (the figures of RELIABILITY.md; tests/service/frontend/test_slow_clients.py and
test_stuck_engine.py run the same with short settings):

- stalled bodies: `--stalled` connections send their headers and part of a body, then nothing; meanwhile
  `--requests` complete requests arrive, 16 at a time. Counts every answer, the complete requests' latency, and
  when each stalled connection got its answer and was closed.
- a stopped engine: SIGSTOP the engine process while `--waiting` requests wait; when each is answered, when
  /live and /health turn 503 (and what they say), then SIGCONT and when /live answers 200 again.

    python -m devkit.stall_drills                                  # about a minute and a half
    python -m devkit.stall_drills --flags="--queue-timeout-s 5"    # other server settings
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import selectors
import signal
import socket
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np

from devkit.server import start_service
from service.settings import DEFAULT_CHECKPOINT


def stalled_connections(url: str, count: int) -> list[socket.socket]:
    host, port = url.removeprefix("http://").split(":")
    made = []
    for _ in range(count):
        sock = socket.create_connection((host, int(port)))
        sock.sendall(b"POST /embed HTTP/1.1\r\nHost: drill\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 200\r\n\r\n{\"inputs\": \"a stalled ri")
        made.append(sock)
    return made


async def complete_requests(url: str, count: int) -> tuple[Counter, list[float]]:
    limit, statuses, latencies = asyncio.Semaphore(16), Counter(), []
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        async def one(i: int) -> None:
            async with limit:
                started = time.perf_counter()
                answer = await client.post("/embed", json={"inputs": [f"a complete request about rivers {i}"] * 4})
                latencies.append(time.perf_counter() - started)
                statuses[answer.status_code] += 1

        await asyncio.gather(*(one(i) for i in range(count)))
    return statuses, latencies


def answers_of(sockets: list[socket.socket], since: float, timeout_s: float) -> tuple[Counter, list[float]]:
    """The status each stalled connection got (or "closed" / "none"), and when its connection was closed."""
    selector, buffers, statuses, closed_at = selectors.DefaultSelector(), {}, Counter(), []
    for sock in sockets:
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ)
        buffers[sock] = b""
    while buffers and time.monotonic() - since < timeout_s:
        for key, _ in selector.select(timeout=0.5):
            sock = key.fileobj
            data = sock.recv(65536)
            buffers[sock] += data
            if not data:
                head = buffers.pop(sock)
                statuses[int(head.split()[1]) if head.startswith(b"HTTP/1.1 ") else "closed"] += 1
                closed_at.append(time.monotonic() - since)
                selector.unregister(sock)
                sock.close()
    statuses["none"] += len(buffers)
    return statuses, closed_at


def stalled_bodies_drill(url: str, stalled: int, requests: int) -> dict:
    sockets = stalled_connections(url, stalled)
    opened = time.monotonic()
    with ThreadPoolExecutor(1) as reader:  # the stalled connections' answers, timed as they come
        stalled_answers = reader.submit(answers_of, sockets, opened, 120)
        statuses, latencies = asyncio.run(complete_requests(url, requests))
        answered_in = time.monotonic() - opened
        stalled_statuses, closed_at = stalled_answers.result()
    return {"stalled_connections": stalled, "complete_requests": requests,
            "complete_statuses": dict(statuses), "complete_p50_ms": round(1000 * float(np.median(latencies)), 1),
            "complete_max_ms": round(1000 * max(latencies), 1), "complete_all_answered_after_s": round(answered_in, 2),
            "stalled_statuses": {str(k): v for k, v in stalled_statuses.items() if v},
            "stalled_closed_after_s": [round(min(closed_at), 2), round(max(closed_at), 2)] if closed_at else None}


def engine_pid(supervisor: int) -> int:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parent = int(open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()[1])
                command = open(f"/proc/{entry}/cmdline", "rb").read()
            except OSError:
                continue
            if parent == supervisor and b"service.engine.server" in command:
                return int(entry)
    raise RuntimeError("no engine process")


def stopped_engine_drill(url: str, engine: int, waiting: int, watch_s: float) -> dict:
    os.kill(engine, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        async def wait_and_watch():
            async with httpx.AsyncClient(base_url=url, timeout=300) as client:
                async def one(i: int):
                    answer = await client.post("/embed", json={"inputs": f"waiting on a stopped engine {i}"})
                    return answer.status_code, time.monotonic() - stopped, answer.json().get("error", "")

                async def watch():
                    turned = {}
                    while time.monotonic() - stopped < watch_s:
                        for path in ("/live", "/health"):
                            answer = await client.get(path)
                            if answer.status_code == 503 and path not in turned:
                                turned[path] = (round(time.monotonic() - stopped, 2), answer.json()["error"])
                        await asyncio.sleep(0.25)
                    return turned

                return await asyncio.gather(asyncio.gather(*(one(i) for i in range(waiting))), watch())

        answers, turned = asyncio.run(wait_and_watch())
    finally:
        os.kill(engine, signal.SIGCONT)
    resumed = time.monotonic()
    while httpx.get(url + "/live").status_code != 200 and time.monotonic() - resumed < 30:
        time.sleep(0.05)
    back_after = time.monotonic() - resumed
    after = httpx.post(url + "/embed", json={"inputs": "after the engine came back"}).status_code
    times = [t for _, t, _ in answers]
    return {"waiting_requests": waiting, "statuses": dict(Counter(s for s, _, _ in answers)),
            "answered_after_s": [round(min(times), 2), round(max(times), 2)], "error": answers[0][2],
            "turned_503": turned, "live_back_after_sigcont_s": round(back_after, 2), "request_after": after}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stalled", type=int, default=512)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--waiting", type=int, default=16)
    parser.add_argument("--watch-s", type=float, default=40.0, help="how long /live and /health are watched")
    parser.add_argument("--flags", default="", help="extra server flags, one string")
    args = parser.parse_args()
    process, url = start_service(DEFAULT_CHECKPOINT, "--workers", "2", *args.flags.split())
    try:
        httpx.post(url + "/embed", json={"inputs": "warm"})
        result = {"server": f"python -m service --workers 2 {args.flags}".strip(),
                  "stalled_bodies": stalled_bodies_drill(url, args.stalled, args.requests),
                  "stopped_engine": stopped_engine_drill(url, engine_pid(process.pid), args.waiting, args.watch_s)}
    finally:
        process.kill()
        process.wait()
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
