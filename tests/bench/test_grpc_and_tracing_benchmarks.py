"""Quick runs of the gRPC-against-HTTP and the tracing-cost benchmarks, so that neither harness can rot: every row
measured, the ratios printed, the traced rows' spans received by the benchmark's collector and the others' not."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from devkit.paths import REPO_ROOT


@pytest.mark.timeout(600)
def test_grpc_against_http_measures_both_protocols(tmp_path):
    out = tmp_path / "grpc.json"
    result = subprocess.run(
        [sys.executable, "-m", "bench.serving.grpc_vs_http", "--workers", "1", "--clients", "4", "--depth", "2",
         "--seconds", "1.5", "--rounds", "1", "--hidden", "32", "--json", str(out)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=500)
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(out.read_text())
    assert [(r["protocol"], r["depth"]) for r in found["runs"]] == [("http", 1), ("grpc", 2)]
    for run in found["runs"]:
        assert run["sentences_per_s"] > 0 and run["server_cpu_ms_per_sentence"] > 0
        assert run["frontend_cpu_ms_per_sentence"] > 0  # --workers 1: the front end is told apart
        assert run["clients_cpu_ms_per_sentence"] > 0  # the load generators' own CPU, apart from the server's
    assert found["throughput_grpc_over_http"] > 0 and "gRPC / HTTP:" in result.stdout


@pytest.mark.timeout(600)
def test_tracing_cost_runs_base_off_and_on(tmp_path):
    out = tmp_path / "tracing.json"
    result = subprocess.run(
        [sys.executable, "-m", "bench.serving.tracing_cost", "--base", str(REPO_ROOT), "--clients", "4",
         "--inputs", "2", "--seconds", "1.5", "--rounds", "1", "--json", str(out)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=500)
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(out.read_text())
    runs = {run["row"]: run for run in found["runs"]}
    assert list(runs) == ["base", "off", "on"]
    assert runs["on"]["spans_received"] > 0 and runs["off"]["spans_received"] == 0 == runs["base"]["spans_received"]
    assert found["on_over_off"] > 0 and found["off_over_base"] > 0
