"""model.cpu_cores: the one answer to "how many cores" for the supervisor, the engine and the trainer."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from model.cpu_cores import usable_cores

MASK = len(os.sched_getaffinity(0))


def cgroup(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


@pytest.mark.parametrize("files, expected", [
    ({"cpu.max": "100000 100000\n"}, 1),  # cgroup v2: a 1-core limit
    ({"cpu.max": "50000 100000\n"}, 1),  # half a core: still one
    ({"cpu.max": "max 100000\n"}, MASK),  # v2: no limit
    ({"cpu/cpu.cfs_quota_us": "100000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 1),  # cgroup v1: 1 core
    ({"cpu,cpuacct/cpu.cfs_quota_us": "100000\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"}, 1),
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, MASK),  # v1: no limit
    ({}, MASK),  # no cgroup found: the affinity mask alone
    ({"cpu.max": "garbage\n"}, MASK),
])
def test_the_quota_caps_the_affinity_mask(tmp_path, files, expected):
    assert usable_cores(cgroup(tmp_path, files)) == expected


def test_a_quota_above_the_mask_leaves_the_mask(tmp_path):
    assert usable_cores(cgroup(tmp_path, {"cpu.max": f"{(MASK + 3) * 100000} 100000\n"})) == MASK


def test_the_mask_caps_too(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})
    assert usable_cores(cgroup(tmp_path, {"cpu.max": "800000 100000\n"})) == 3
    assert usable_cores(cgroup(tmp_path, {"cpu.max": "200000 100000\n"})) == 2


def test_the_engine_sizes_torchs_threads_from_the_quota(monkeypatch, tmp_path):
    """In a CPU-limited pod the engine's threads follow the quota, not the node's cores."""
    import torch

    from model import cpu_cores
    from service.engine import loader

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))  # a 64-core node
    monkeypatch.setattr(cpu_cores, "CGROUP_ROOT", tmp_path)
    cgroup(tmp_path, {"cpu.max": "400000 100000\n"})  # limited to 4 cores
    before = torch.get_num_threads()
    try:
        assert loader.plan_compute(0, torch.device("cpu")) == 2 and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
