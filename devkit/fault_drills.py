"""Fault drills on the compose `scale` profile (replicas behind nginx), against a real Docker engine: each
event happens while clients send requests back to back, and every request is counted (an HTTP status, or
the name of the transport error when the connection failed). A request is lost unless it was answered 200.

Events, each repeated: a replica stopped gracefully (`docker stop`), a replica's server killed with SIGKILL
mid-request (from the host, so Docker's restart policy brings it back), scale 3 -> 4, scale 4 -> 3, and a
balancer reload (`nginx -s reload`), with the replicas' default process arrangement (one process on a CPU).
Then, with BERT_WORKERS=2 (a supervisor, an engine process and two front ends in each replica): `docker stop`
of a replica, kill -9 of one front-end process inside a replica (the supervisor restarts it; the container
stays up), and kill -9 of a replica's engine process (the replica fails its requests in flight with 503 at
once, exits 1, and Docker's restart policy brings it back). Each of those also records what happened inside
the replica (`facts`: its exit code, restarts, the server's own log lines, the balancer's upstream errors).
Used by `make test-docker` (devkit/docker_check.py); on its own:

    python -m devkit.fault_drills --repeat 3     # needs the CPU image built (make test-docker builds it)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
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
    workers: str = "auto"  # BERT_WORKERS of the replicas
    requests: int = 0
    lost: int = 0
    outcomes: dict = field(default_factory=dict)
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    p99_during_event_ms: float = 0.0  # requests sent from the event's start until 5 s after it finished
    max_during_event_ms: float = 0.0
    event_s: float = 0.0
    facts: dict = field(default_factory=dict)  # what the event's own checks saw; facts["ok"] False fails the drill


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


def inspect(container: str, field: str) -> str:
    return sh("docker", "inspect", "-f", "{{" + field + "}}", container).strip()


def logs_since(container: str, since: str) -> str:
    done = subprocess.run(["docker", "logs", "--since", since, container], capture_output=True, text=True)
    return done.stdout + done.stderr


def now() -> str:
    """The host's clock as `docker logs --since` and `docker events` read it."""
    return f"{time.time():.3f}"


def server_pids(container: str, module: str) -> list[str]:
    """Host pids of a replica's processes running `python -m module` (`docker top` lists host pids, so they can be
    killed from the host: the same SIGKILL as from inside, and the image needs no procps)."""
    rows = sh("docker", "top", container, "-eo", "pid,args").splitlines()[1:]
    return [row.split()[0] for row in rows if f"-m {module}" in row]


def balancer_upstream_errors(since: str) -> int:
    """Lines of nginx's error log (docker/nginx.conf sends it to stderr) about a replica failing a request: a reset
    or refused connection, each one a request nginx sent on to another replica (or answered with an error itself).
    A 503 from a draining replica is retried without a line."""
    lb = sh(*SCALE, "ps", "-q", "lb").strip()
    return sum("upstream" in line for line in logs_since(lb, since).splitlines())


def wait_for(condition, timeout_s: float, every_s: float = 0.2) -> bool:
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        if condition():
            return True
        time.sleep(every_s)
    return False


def nothing() -> None:
    return None


def graceful_stop() -> tuple[callable, callable, dict]:
    victim, facts, started = replicas()[0], {}, now()

    def stop() -> None:
        sh("docker", "stop", victim)
        logs = logs_since(victim, started)
        answered = [tuple(map(int, m)) for m in re.findall(r"answered (\d+) of (\d+) accepted", logs)]
        facts.update(exit_code=int(inspect(victim, ".State.ExitCode")), answered_of_accepted=answered,
                     traceback_in_log="Traceback" in logs, lb_upstream_errors=balancer_upstream_errors(started))
        facts["ok"] = (facts["exit_code"] == 0 and bool(answered) and all(a == b for a, b in answered)
                       and not facts["traceback_in_log"])

    return stop, (lambda: sh("docker", "start", victim)), facts


def kill_mid_request() -> tuple[callable, callable, dict]:
    victim = replicas()[0]

    def kill() -> None:
        pid = inspect(victim, ".State.Pid")
        subprocess.run(["kill", "-9", pid], check=True)  # from the host: a crash, so restart: unless-stopped applies

    return kill, nothing, {}


def kill_front_end() -> tuple[callable, callable, dict]:
    """kill -9 of one front-end process: the supervisor starts it again in its slot; the container stays up."""
    victim, facts, started = replicas()[0], {}, now()
    container_started, restarts = inspect(victim, ".State.StartedAt"), inspect(victim, ".RestartCount")

    def kill() -> None:
        before = server_pids(victim, "service.frontend.worker")
        subprocess.run(["kill", "-9", before[0]], check=True)
        replaced = wait_for(lambda: len(set(server_pids(victim, "service.frontend.worker")) - set(before)) == 1
                            and len(server_pids(victim, "service.frontend.worker")) == len(before), 15)
        facts.update(front_ends_before=len(before), replaced_within_15_s=replaced)

    def check() -> None:
        logs = logs_since(victim, started)
        facts.update(container_kept=inspect(victim, ".State.StartedAt") == container_started
                     and inspect(victim, ".RestartCount") == restarts,
                     supervisor_restarted_it="starting it again" in logs,
                     lb_upstream_errors=balancer_upstream_errors(started))
        facts["ok"] = facts["replaced_within_15_s"] and facts["container_kept"] and facts["supervisor_restarted_it"]

    return kill, check, facts


def kill_engine() -> tuple[callable, callable, dict]:
    """kill -9 of a replica's engine process: its front ends fail what is in flight with 503 at once, /live turns
    503, the supervisor exits 1, and Docker's restart policy starts the container again."""
    victim, facts, started = replicas()[0], {}, now()
    restarts = int(inspect(victim, ".RestartCount"))

    def kill() -> None:
        pid = server_pids(victim, "service.engine.server")[0]
        subprocess.run(["kill", "-9", pid], check=True)
        # /live from inside the replica, polled from just after the kill until it is not 200 (or the replica is gone)
        live = subprocess.run(["docker", "exec", victim, "python", "-c", LIVE_PROBE], capture_output=True, text=True)
        facts["live_after_kill"] = live.stdout.strip() or "container gone"
        facts["restarted_within_60_s"] = wait_for(lambda: int(inspect(victim, ".RestartCount")) > restarts, 60)

    def check() -> None:
        logs = logs_since(victim, started)
        died = sh("docker", "events", "--since", started, "--until", now(), "--filter", f"container={victim}",
                  "--filter", "event=die", "--format", "{{.Actor.Attributes.exitCode}}").split()
        failed = re.findall(r"failing (\d+) requests in flight", logs)
        facts.update(exit_codes=died, front_ends_failed_in_flight=[int(n) for n in failed],
                     supervisor_saw_engine_end="the engine process ended" in logs,
                     lb_upstream_errors=balancer_upstream_errors(started))
        facts["ok"] = facts["restarted_within_60_s"] and died[:1] == ["1"] and facts["supervisor_saw_engine_end"]

    return kill, check, facts


LIVE_PROBE = """import time, urllib.request, urllib.error
started, seen = time.perf_counter(), []
while time.perf_counter() - started < 5:
    try:
        status = str(urllib.request.urlopen('http://127.0.0.1:8000/live', timeout=1).status)
    except urllib.error.HTTPError as exc:
        status = str(exc.code)
    except Exception as exc:
        status = type(exc).__name__
    seen.append(status)
    if status != '200':
        break
    time.sleep(0.02)
print(f"{len(seen) - 1} x 200, then {seen[-1]} after {time.perf_counter() - started:.2f} s")"""


def scale_to(count: int) -> tuple[callable, callable, dict]:
    return (lambda: sh(*SCALE, "up", "-d", "--no-recreate", "--scale", f"api-replica={count}")), nothing, {}


def balancer_reload() -> tuple[callable, callable, dict]:
    return (lambda: sh(*SCALE, "exec", "lb", "nginx", "-s", "reload")), nothing, {}


def reload_storm(count: int = 20, every_s: float = 0.5) -> tuple[callable, callable, dict]:
    def storm() -> None:
        for _ in range(count):
            sh(*SCALE, "exec", "lb", "nginx", "-s", "reload")
            time.sleep(every_s)

    return storm, nothing, {}


EVENTS = {  # name: (make the event, replicas before, replicas after)
    "graceful stop of a replica": (graceful_stop, 3, 3),
    "kill -9 of a replica mid-request": (kill_mid_request, 3, 3),
    "scale up 3 -> 4": (lambda: scale_to(4), 3, 4),
    "scale down 4 -> 3": (lambda: scale_to(3), 4, 3),
    "balancer reload": (balancer_reload, 3, 3),
    "20 balancer reloads, 0.5 s apart": (reload_storm, 3, 3),  # widens the window of a reload race
}
PROCESS_WORKERS = "2"  # BERT_WORKERS for the drills below: an engine process and two front ends per replica
PROCESS_EVENTS = {
    "graceful stop of a replica, 2 front ends": (graceful_stop, 3, 3),
    "kill -9 of a front-end process in a replica": (kill_front_end, 3, 3),
    "kill -9 of a replica's engine process": (kill_engine, 3, 3),
}


def run_drill(name: str, run: int, events: dict, workers: str) -> Drill:
    make, before, after = events[name]
    wait_all_healthy(before)
    event, restore, facts = make()
    outcomes, timeline, (start, end) = asyncio.run(drive(event))
    restore()
    wait_all_healthy(after)
    latencies = np.array([latency for _, latency, _ in timeline]) * 1000
    during = np.array([latency for sent, latency, _ in timeline if start <= sent <= end + 5]) * 1000
    return Drill(event=name, run=run, workers=workers, requests=sum(outcomes.values()),
                 lost=sum(n for outcome, n in outcomes.items() if outcome != "200"), outcomes=dict(outcomes),
                 p50_ms=round(float(np.percentile(latencies, 50)), 1), p99_ms=round(float(np.percentile(latencies, 99)), 1),
                 p99_during_event_ms=round(float(np.percentile(during, 99)), 1) if len(during) else 0.0,
                 max_during_event_ms=round(float(during.max()), 1) if len(during) else 0.0,
                 event_s=round(end - start, 2), facts=facts)


def run_drills(repeat: int) -> list[Drill]:
    """EVENTS with the replicas' default arrangement, then PROCESS_EVENTS with BERT_WORKERS=2 (a fresh `up`)."""
    drills = []
    for events, workers in ((EVENTS, os.environ.get("BERT_WORKERS", "auto")), (PROCESS_EVENTS, PROCESS_WORKERS)):
        if events:
            drills += _run_set(events, workers, repeat)
    return drills


def _run_set(events: dict, workers: str, repeat: int) -> list[Drill]:
    saved = os.environ.get("BERT_WORKERS")
    os.environ["BERT_WORKERS"] = workers  # compose passes it to the replicas (docker-compose.yml)
    sh(*SCALE, "up", "-d", "--scale", "api-replica=3")
    try:
        wait_all_healthy(3)
        drills = []
        for run in range(1, repeat + 1):
            for name in events:
                drill = run_drill(name, run, events, workers)
                print(json.dumps(asdict(drill)), flush=True)
                drills.append(drill)
        return drills
    finally:
        sh(*SCALE, "down", "-v", check=False)
        if saved is None:
            del os.environ["BERT_WORKERS"]
        else:
            os.environ["BERT_WORKERS"] = saved


def passed(drills: list[Drill]) -> bool:
    return all(d.lost == 0 and d.facts.get("ok", True) for d in drills)


def table(drills: list[Drill]) -> str:
    rows = ["| event | workers | run | requests | lost | outcomes | p50 ms | p99 ms | p99 during the event ms | "
            "max during ms | event took s | facts |", "|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---|"]
    for d in drills:
        outcomes = ", ".join(f"{n} x {o}" for o, n in sorted(d.outcomes.items()))
        facts = "; ".join(f"{k}={v}" for k, v in d.facts.items())
        rows.append(f"| {d.event} | {d.workers} | {d.run} | {d.requests:,} | **{d.lost}** | {outcomes} | {d.p50_ms:.0f} | "
                    f"{d.p99_ms:.0f} | {d.p99_during_event_ms:.0f} | {d.max_during_event_ms:.0f} | {d.event_s:.1f} | "
                    f"{facts} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    every = [*EVENTS, *PROCESS_EVENTS]
    parser.add_argument("--events", nargs="+", choices=every, default=every)
    args = parser.parse_args(argv)
    for events in (EVENTS, PROCESS_EVENTS):
        for name in list(events):
            if name not in args.events:
                del events[name]
    drills = run_drills(args.repeat)
    print(table(drills))
    lost = sum(d.lost for d in drills)
    print(f"fault drills: {sum(d.requests for d in drills):,} requests, {lost} lost; "
          f"checks inside the replicas {'passed' if passed(drills) else 'FAILED'}")
    return 0 if passed(drills) else 1


if __name__ == "__main__":
    sys.exit(main())
