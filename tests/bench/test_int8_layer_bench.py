"""bench.peak.int8_layer: the one-call int8 layer is checked equal to its modules and timed beside them, one row per
thread count and batch; a malformed batch is refused with a message naming it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from devkit.paths import REPO_ROOT
from kernels import int8_layer


def run_bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench.peak.int8_layer", *args], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.skipif(int8_layer.kernel() is None, reason=f"no one-call int8 layer here: {int8_layer.why_not()}")
def test_a_small_run_reports_each_batch():
    run = run_bench("--batches", "1x7", "3x20", "--threads", "1")
    assert run.returncode == 0, run.stderr
    rows = [line.split("|")[1:-1] for line in run.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    header, body = rows[0], rows[1:]
    assert [cell.strip() for cell in header][:2] == ["threads", "batch"]
    layout = int8_layer.kernel().layout
    variants = [found.products for found in (choice() for choice in int8_layer.kernel.choices)
                if found is not None and found.layout == layout]  # AMX's and VNNI's on a CPU with AMX
    assert [(cells[0].strip(), cells[1].strip(), cells[5].strip()) for cells in body] == \
        [("1", batch, name) for batch in ("1 x 7", "3 x 20") for name in variants]
    assert all(float(cells[2]) > 0 and float(cells[3]) > 0 for cells in body)
    assert f"the {' and '.join(variants)} one-call layer" in run.stdout


@pytest.mark.parametrize("batch", ["16", "0x30", "2x600", "axb"])
def test_a_malformed_batch_is_refused_by_name(batch):
    run = run_bench("--batches", batch)
    assert run.returncode == 2 and "Traceback" not in run.stderr and batch in run.stderr, run.stderr
