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


def test_request_cost_measures_each_part(tiny_checkpoint):
    """The front end answers 200 on every path (checked inside), and every part costs some CPU."""
    import asyncio

    from bench.serving.request_cost import engine_us_per_input, front_end_us
    from model import load_checkpoint

    texts = ["a crane is flying over the river", "the river", "it rains on the hills and the river rises"] * 30
    costs = asyncio.run(front_end_us(tiny_checkpoint, texts, 8, 60, rounds=1))
    assert sorted(costs) == sorted(["direct", "fast routes", "FastAPI"]) and min(costs.values()) > 0
    selecting, computing = engine_us_per_input(load_checkpoint(tiny_checkpoint), texts, 8)
    assert selecting > 0 and computing > 0


def test_the_http_floor_answers_like_the_service():
    """bench.serving.server_cpu's floor row: bare uvicorn answering /embed with one vector per input."""
    import httpx

    from bench.serving.server_cpu import start_floor

    process, url = start_floor()
    try:
        answer = httpx.post(url + "/embed", json={"inputs": ["a", "b", "c"]})
        assert answer.status_code == 200 and [len(v) for v in answer.json()] == [32, 32, 32]
    finally:
        process.terminate()
        process.wait(30)
