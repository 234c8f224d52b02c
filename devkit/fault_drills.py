"""Fault drills on the compose `scale` profile (replicas behind nginx), against a real Docker engine: each
event happens while clients send requests back to back, and every request is counted (an HTTP status, or
the name of the transport error when the connection failed). A request is lost unless it was answered 200.

Events, each repeated: a replica stopped gracefully (`docker stop`), a replica's server killed with SIGKILL
mid-request (from the host, so Docker's restart policy brings it back), scale 3 -> 4, scale 4 -> 3, and a
balancer reload (`nginx -s reload`). Used by `make test-docker` (devkit/docker_check.py); on its own:

    python -m devkit.fault_drills --repeat 3     # needs the CPU image built (make test-docker builds it)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

import httpx
import numpy as np

from devkit.paths import REPO_ROOT

SCALE = ["docker", "compose", "-f", "docker-compose.yml", "-f", "docker-compose.cpu.yml", "--profile", "scale"]
URL = "http://127.0.0.1:8080"
CLIENTS, INPUTS_PER_REQUEST, SECONDS, EVENT_AT = 32, 4, 15.0, 4.0


def sh(*command: str, check: bool = True) -> str:
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"$ {' '.join(command)}\n{done.stdout}\n{done.stderr}")
    return done.stdout


@dataclass
class Drill:
    event: str
    run: int
    requests: int = 0
    lost: int = 0
    outcomes: dict = field(default_factory=dict)
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    p99_during_event_ms: float = 0.0  # requests sent from the event's start until 5 s after it finished
    event_s: float = 0.0


async def drive(event=None, seconds: float = SECONDS, url: str = URL, clients: int = CLIENTS,
                event_at: float = EVENT_AT) -> tuple[Counter, list[tuple[float, float, str]], tuple[float, float]]:
    """`clients` clients sending /encode back to back; `event()`, if given, runs in a thread `event_at` seconds in.
    Returns the outcomes, (sent_at, latency_s, outcome) per request, and the event's (start, end) on the same
    clock ((0, 0) without one)."""
    outcomes: Counter = Counter()
    timeline: list[tuple[float, float, str]] = []
    started = time.perf_counter()
    window: list[float] = []

    async def client(number: int) -> None:
        # a fresh pool per client, as independent users would have; the default keep-alive of httpx
        async with httpx.AsyncClient(base_url=url, timeout=120) as http:
            while time.perf_counter() - started < seconds:
                sent = time.perf_counter()
                body = {"inputs": [f"client {number} asks about the river bank number {len(timeline)}"]
                        * INPUTS_PER_REQUEST, "pooling": "mean"}
                try:
                    outcome = str((await http.post("/encode", json=body)).status_code)
                except httpx.TransportError as exc:
                    outcome = type(exc).__name__
                outcomes[outcome] += 1
                timeline.append((sent - started, time.perf_counter() - sent, outcome))

    async def act() -> None:
        await asyncio.sleep(event_at)
        window.append(time.perf_counter() - started)
        await asyncio.to_thread(event)
        window.append(time.perf_counter() - started)

    await asyncio.gather(*(client(n) for n in range(clients)), *([act()] if event else []))
    return outcomes, timeline, (window[0], window[1]) if window else (0.0, 0.0)


def replicas() -> list[str]:
    return sorted(sh(*SCALE, "ps", "-q", "api-replica").split())


def wait_all_healthy(expected: int, timeout_s: float = 240) -> None:
    """Every replica healthy by Docker's own check, and the balancer answering."""
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        ids = sh(*SCALE, "ps", "-q", "--status", "running", "api-replica").split()
        states = [sh("docker", "inspect", "-f", "{{.State.Health.Status}}", c, check=False).strip() for c in ids]
        if len(ids) == expected and all(s == "healthy" for s in states):
            try:
                if httpx.get(URL + "/health", timeout=5).status_code == 200:
                    time.sleep(6)  # the balancer re-reads the replica list every 5 s
                    return
            except httpx.TransportError:
                pass
        time.sleep(1)
    raise RuntimeError(f"{expected} healthy replicas not reached within {timeout_s:.0f} s")


def graceful_stop() -> tuple[callable, callable]:
    victim = replicas()[0]
    return (lambda: sh("docker", "stop", victim)), (lambda: sh("docker", "start", victim))


def kill_mid_request() -> tuple[callable, callable]:
    victim = replicas()[0]

    def kill() -> None:
        pid = sh("docker", "inspect", "-f", "{{.State.Pid}}", victim).strip()
        subprocess.run(["kill", "-9", pid], check=True)  # from the host: a crash, so restart: unless-stopped applies

    return kill, (lambda: None)


def scale_to(count: int) -> tuple[callable, callable]:
    return (lambda: sh(*SCALE, "up", "-d", "--no-recreate", "--scale", f"api-replica={count}")), (lambda: None)


def balancer_reload() -> tuple[callable, callable]:
    return (lambda: sh(*SCALE, "exec", "lb", "nginx", "-s", "reload")), (lambda: None)


def reload_storm(count: int = 20, every_s: float = 0.5) -> tuple[callable, callable]:
    def storm() -> None:
        for _ in range(count):
            sh(*SCALE, "exec", "lb", "nginx", "-s", "reload")
            time.sleep(every_s)

    return storm, (lambda: None)


EVENTS = {  # name: (make the event, replicas before, replicas after)
    "graceful stop of a replica": (graceful_stop, 3, 3),
    "kill -9 of a replica mid-request": (kill_mid_request, 3, 3),
    "scale up 3 -> 4": (lambda: scale_to(4), 3, 4),
    "scale down 4 -> 3": (lambda: scale_to(3), 4, 3),
    "balancer reload": (balancer_reload, 3, 3),
    "20 balancer reloads, 0.5 s apart": (reload_storm, 3, 3),  # widens the window of a reload race
}


def run_drill(name: str, run: int) -> Drill:
    make, before, after = EVENTS[name]
    wait_all_healthy(before)
    event, restore = make()
    outcomes, timeline, (start, end) = asyncio.run(drive(event))
    restore()
    wait_all_healthy(after)
    latencies = np.array([latency for _, latency, _ in timeline]) * 1000
    during = np.array([latency for sent, latency, _ in timeline if start <= sent <= end + 5]) * 1000
    return Drill(event=name, run=run, requests=sum(outcomes.values()),
                 lost=sum(n for outcome, n in outcomes.items() if outcome != "200"), outcomes=dict(outcomes),
                 p50_ms=round(float(np.percentile(latencies, 50)), 1), p99_ms=round(float(np.percentile(latencies, 99)), 1),
                 p99_during_event_ms=round(float(np.percentile(during, 99)), 1) if len(during) else 0.0,
                 event_s=round(end - start, 2))


def run_drills(repeat: int) -> list[Drill]:
    sh(*SCALE, "up", "-d", "--scale", "api-replica=3")
    try:
        wait_all_healthy(3)
        drills = []
        for run in range(1, repeat + 1):
            for name in EVENTS:
                drill = run_drill(name, run)
                print(json.dumps(asdict(drill)), flush=True)
                drills.append(drill)
        return drills
    finally:
        sh(*SCALE, "down", "-v", check=False)


def table(drills: list[Drill]) -> str:
    rows = ["| event | run | requests | lost | outcomes | p50 ms | p99 ms | p99 during the event ms | event took s |",
            "|---|---:|---:|---:|---|---:|---:|---:|---:|"]
    for d in drills:
        outcomes = ", ".join(f"{n} x {o}" for o, n in sorted(d.outcomes.items()))
        rows.append(f"| {d.event} | {d.run} | {d.requests:,} | **{d.lost}** | {outcomes} | {d.p50_ms:.0f} | "
                    f"{d.p99_ms:.0f} | {d.p99_during_event_ms:.0f} | {d.event_s:.1f} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--events", nargs="+", choices=list(EVENTS), default=list(EVENTS))
    args = parser.parse_args(argv)
    for name in list(EVENTS):
        if name not in args.events:
            del EVENTS[name]
    drills = run_drills(args.repeat)
    print(table(drills))
    lost = sum(d.lost for d in drills)
    print(f"fault drills: {sum(d.requests for d in drills):,} requests, {lost} lost")
    return 0 if lost == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
