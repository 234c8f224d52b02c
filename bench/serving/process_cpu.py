"""The server's processes and threads and the CPU each has used, read from /proc (Linux): what the benchmarks divide
by the requests answered, and which part of the server kept a core busy."""

from __future__ import annotations

import os
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def process_tree(root: int) -> list[int]:
    """`root` and every process below it."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(parents.get(pid, []))
    return found


def front_ends(pids: list[int]) -> set[int]:
    """Which of `pids` are HTTP front-end workers (docs/processes.md)."""
    found = set()
    for pid in pids:
        try:
            if b"service.frontend.worker" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.add(pid)
        except OSError:
            continue
    return found


def cpu_seconds(pids: list[int]) -> dict[int, float]:
    """User + system CPU seconds of each live process."""
    out = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[pid] = (int(fields[11]) + int(fields[12])) / TICKS
    return out


def engine_process(pids: list[int]) -> int | None:
    """Which of `pids` is the engine process (docs/processes.md); None with one process (`--workers 0`)."""
    for pid in pids:
        try:
            if b"service.engine.server" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        except OSError:
            continue
    return None


def thread_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """Each live thread of `pid`: its id -> (its name, "main" for the process's first, user + system CPU seconds)."""
    out = {}
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in threads:
        try:
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(tid)] = ("main" if int(tid) == pid else name, (int(fields[11]) + int(fields[12])) / TICKS)
    return out


def busiest_threads(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], seconds: float,
                    top: int = 4) -> tuple[float, str]:
    """(the cores a process's threads kept busy between two `thread_cpu` readings, its `top` busiest threads as
    "name cores, ...")."""
    used = {tid: (name, cpu - before.get(tid, (name, 0.0))[1]) for tid, (name, cpu) in after.items()}
    busiest = sorted(used.values(), key=lambda named: -named[1])[:top]
    return (sum(cpu for _, cpu in used.values()) / seconds,
            ", ".join(f"{name} {cpu / seconds:.2f}" for name, cpu in busiest if cpu > 0))
