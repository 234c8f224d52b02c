"""bench.peak.bf16_products: the bfloat16 tile products checked against float32's and timed beside torch's bfloat16
Linear, one row per thread count and row count."""

from __future__ import annotations

import subprocess
import sys

import pytest

from devkit.paths import REPO_ROOT
from kernels import bf16_linear


@pytest.mark.skipif(bf16_linear.kernel() is None, reason=f"no bfloat16 tile products here: {bf16_linear.why_not()}")
def test_a_small_run_reports_each_row_count():
    run = subprocess.run([sys.executable, "-m", "bench.peak.bf16_products", "--rows", "1", "17", "--threads", "1"],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    rows = [line.split("|")[1:-1] for line in run.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    header, body = [cell.strip() for cell in rows[0]], rows[1:]
    assert header[:2] == ["threads", "rows"] and header[-1] == "tiles / torch"
    assert [(cells[0].strip(), cells[1].strip()) for cells in body] == [("1", "1"), ("1", "17")]
    assert all(float(cells[2]) > 0 and float(cells[4]) > 0 for cells in body)


def test_without_the_tiles_it_says_why(monkeypatch):
    from bench.peak import bf16_products

    monkeypatch.setattr(bf16_linear, "kernel", lambda: None)
    monkeypatch.setattr(bf16_linear, "why_not", lambda: "this CPU lacks amx_bf16")
    monkeypatch.setattr(sys, "argv", ["bf16_products"])
    with pytest.raises(SystemExit, match="no bfloat16 tile products here: this CPU lacks amx_bf16"):
        bf16_products.main()
