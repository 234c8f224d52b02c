"""How many CPU cores this process may use: one answer for the supervisor (how many front ends), the engine (torch's
threads on a CPU) and the trainer (its data-preparation workers).

Two limits apply and neither shows the other. The affinity mask (`taskset`, cpusets) names the cores the process may
run on; a container's CPU quota (cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`) caps the time it
may spend on them, and is invisible to the mask: a pod limited to 4 cores on a 64-core node sees 64. Sizing thread
pools from the node's cores there runs 64 threads on 4 cores' worth of time, and they throttle each other.
"""

from __future__ import annotations

import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
# Where cgroup v1 mounts the CPU controller: alone, or joined with cpuacct (both names are in use).
_V1_FOLDERS = ("cpu", "cpu,cpuacct", "cpuacct,cpu")


def usable_cores(cgroup_root: Path | None = None) -> int:
    """The cores this process may use: its affinity mask, capped by its cgroup's CPU quota (whole cores, rounded
    down), at least 1. `cgroup_root`: where the cgroup file system is mounted (default CGROUP_ROOT; tests point
    it at a folder of their own)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = cpu_quota(CGROUP_ROOT if cgroup_root is None else cgroup_root)
    return max(1, min(cores, int(quota)) if quota is not None else cores)


def cpu_quota(cgroup_root: Path) -> float | None:
    """The CPU time the cgroup may use, in cores (quota / period), or None when it has no limit or none is found."""
    v2 = _read(cgroup_root / "cpu.max")
    if v2 is not None:
        fields = v2.split()
        return _ratio(fields[0], fields[1]) if len(fields) == 2 and fields[0] != "max" else None
    for folder in _V1_FOLDERS:
        quota = _read(cgroup_root / folder / "cpu.cfs_quota_us")
        period = _read(cgroup_root / folder / "cpu.cfs_period_us")
        if quota is not None and period is not None:
            return _ratio(quota, period)  # v1 writes -1 for no limit
    return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _ratio(quota: str, period: str) -> float | None:
    try:
        quota_us, period_us = int(quota), int(period)
    except ValueError:
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None
