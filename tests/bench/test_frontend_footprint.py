"""bench.serving.frontend_footprint: a front end's start and memory, measured in fresh processes of a checkout."""

from __future__ import annotations

from bench.serving.frontend_footprint import front_end_pids, start_cost
from devkit.paths import REPO_ROOT
from devkit.server import start_service


def test_the_start_probe_measures_a_torch_free_front_end(tiny_checkpoint):
    result = start_cost(REPO_ROOT, tiny_checkpoint, repeats=1)
    assert result["torch_imported"] is False
    assert 0 < result["seconds_to_app"] < result["seconds_with_interpreter"] and 20 < result["peak_rss_mib"] < 300


def test_it_finds_the_front_end_processes_of_a_running_service(tiny_checkpoint):
    process, _ = start_service(tiny_checkpoint, "--workers", "2")
    try:
        assert len(front_end_pids(process.pid)) == 2
    finally:
        process.terminate()
        process.wait(timeout=30)
