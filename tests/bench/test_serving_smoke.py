"""A quick run of the serving benchmark on a tiny checkpoint, so the harness cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys

from devkit.paths import REPO_ROOT


def test_serving_benchmark_runs_every_system(tiny_checkpoint, tmp_path):
    out = tmp_path / "rows.json"
    result = subprocess.run(
        [sys.executable, "-m", "bench.serving", "--checkpoint", str(tiny_checkpoint), "--concurrency", "1", "4",
         "--duration", "1", "--sentences", "60", "--json", str(out)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads(out.read_text())
    systems = [(r["system"], r["concurrency"]) for r in rows]
    assert systems == [("limit (in-process)", 0), ("service", 1), ("service", 4), ("service-nobatch", 1),
                       ("service-nobatch", 4), ("naive", 1), ("naive", 4)]
    for row in rows:
        assert row["requests"] > 0 and row["sequences_per_s"] > 0 and row["tokens_per_s"] > 0
    service = [r for r in rows if r["system"] == "service"]
    assert all(r["mean_batch"] >= 1 and 0 <= r["padding"] < 1 and r["vs_limit"] > 0 for r in service)
    assert "| system | concurrency |" in result.stdout


def test_cpu_budget_accounts_for_the_machine(tiny_checkpoint):
    """The CPU budget names the load generator, the server's threads (runners by name) and idle time,
    and what it accounts for cannot exceed the machine."""
    from bench.serving.cpu_budget import measure

    result = measure(tiny_checkpoint, concurrency=2, inputs_per_request=2, seconds=1.0)
    assert result["sequences_per_s"] > 0 and result["mean_batch"] >= 1
    assert "event loop" in result["threads"] and any(n.startswith("bert-runner-") for n in result["threads"])
    accounted = result["load_generator_cores"] + result["idle_cores"] + sum(c for c, _ in result["threads"].values())
    assert 0 < accounted <= result["cores"] * 1.1


def test_cpu_ceiling_reports_every_precision_and_restores_int8(tiny_checkpoint, capsys):
    """The ceiling benchmark prints a row per precision plus the free-quantization bound, and puts the
    real int8 layer back afterwards (its timing-only stand-in computes wrong values)."""
    from bench.precision.cpu_ceiling import main
    from model.quantize import Int8GeluIntermediate, Int8Linear

    real_forwards = Int8Linear.forward, Int8GeluIntermediate.forward
    assert main(["--checkpoint", str(tiny_checkpoint), "--sentences", "40", "--batch", "10", "--seconds", "0.2"]) == 0
    assert (Int8Linear.forward, Int8GeluIntermediate.forward) == real_forwards
    table = capsys.readouterr().out
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| precision")]
    assert [r.split(" | ")[0] for r in rows][0] == "| float32"
    assert rows[-1].startswith("| int8, quantization, dequantization and GELU free")
    assert any(r.startswith("| int8 (served) |") for r in rows)
