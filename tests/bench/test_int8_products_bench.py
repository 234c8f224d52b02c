"""bench.peak.int8_products: every products kernel this CPU runs is checked against torch._int_mm and timed beside
float32's product, one row per kernel, thread count and row count."""

from __future__ import annotations

import subprocess
import sys

import pytest

from devkit.paths import REPO_ROOT
from kernels import int8_products


@pytest.mark.skipif(int8_products.kernel() is None, reason=f"no products kernel here: {int8_products.why_not()}")
def test_a_small_run_reports_each_kernel_it_can_run():
    run = subprocess.run([sys.executable, "-m", "bench.peak.int8_products", "--rows", "1", "7", "--threads", "1",
                          "--skip-int-mm"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    rows = [line.split("|")[1:-1] for line in run.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    header, body = rows[0], rows[1:]
    assert [cell.strip() for cell in header][:3] == ["kernel", "threads", "rows"]
    runnable = [found.instruction_set for found in (choice() for choice in int8_products.kernel.choices) if found]
    expected = {(name, row) for row in ("1", "7") for name in runnable}
    assert {(cells[0].strip(), cells[2].strip()) for cells in body} == expected
    assert all(float(cells[3]) > 0 and float(cells[5]) > 0 for cells in body)
