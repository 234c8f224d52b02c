"""`python -m bench.gpu --dry-run`: every step of the GPU check (the GPU-marked tests, the service against the
in-process limit, the trainer's tokens/s and MFU, the summary) on the CPU, so that the script cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys

from devkit.paths import REPO_ROOT


def test_gpu_check_runs_every_step_on_the_cpu(tmp_path):
    result = subprocess.run([sys.executable, "-m", "bench.gpu", "--dry-run", "--out", str(tmp_path)], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((tmp_path / "gpu-summary.json").read_text())
    tests = summary["gpu_tests"]
    assert tests["passed"] >= 4 and tests["failures"] == tests["errors"] == 0, tests
    serving = summary["serving"]
    assert serving["limit_sequences_per_s"] > 0 and serving["service"][0]["sequences_per_s"] > 0
    assert 0 < serving["service"][0]["vs_limit"] < 2
    run = summary["training"]["single"]
    assert run["tokens_per_s"] > 0 and 0 < run["mfu_vs_measured_peak"] < 1
    assert summary["environment"]["device"] == "cpu" and summary["matmul_peak_tflops"] > 0
    report = (tmp_path / "gpu-summary.md").read_text()
    assert "GPU-marked tests" in report and "in-process limit" in report and "training (single)" in report
