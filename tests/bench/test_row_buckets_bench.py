"""bench.precision.row_buckets: both ways run, each in a process of its own, and report their memory and speed."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch

from devkit.paths import REPO_ROOT


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="a torch with oneDNN")
def test_quick_run_reports_both_ways():
    run = subprocess.run([sys.executable, "-m", "bench.precision.row_buckets", "--quick"], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    rows = [line for line in run.stdout.splitlines() if line.startswith("turn 1")]
    assert [row.split(",")[1].split(":")[0].strip() for row in rows] == ["exact", "rounded"]
    for row in rows:
        speed = float(re.search(r"(\d+) tokens/s", row).group(1))
        loaded, after = (float(x) for x in re.search(r"after loading (\d+), every 100 batches (\d+)", row).groups())
        assert speed > 0 and loaded > 50 and after >= loaded * 0.9
