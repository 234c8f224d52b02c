"""A quick run of the serving benchmark on a tiny checkpoint, so the harness cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.serving.throughput import own_loads
from devkit.paths import REPO_ROOT


def test_serving_benchmark_runs_every_system(tiny_checkpoint, tmp_path):
    out = tmp_path / "rows.json"
    result = subprocess.run(
        [sys.executable, "-m", "bench.serving", "--checkpoint", str(tiny_checkpoint), "--concurrency", "1", "4",
         "--duration", "1", "--sentences", "60", "--json", str(out),
         "--systems", "service", "service:float32@1x1", "service-nobatch", "naive@4x1"],  # a peer where named
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads(out.read_text())
    systems = [(r["system"], r["concurrency"]) for r in rows]
    assert systems == [("limit (in-process)", 0), ("service", 1), ("service", 4), ("service:float32", 1),
                       ("service-nobatch", 1), ("service-nobatch", 4), ("naive", 4)]
    # float32 is what the limit for --dtype auto measures on a CPU: that engine's limit is measured once
    assert result.stdout.count("# limit's engine:") == 1, result.stdout
    for row in rows:
        assert row["requests"] > 0 and row["sequences_per_s"] > 0 and row["tokens_per_s"] > 0
    service = [r for r in rows if r["system"] == "service"]
    assert all(r["mean_batch"] >= 1 and 0 <= r["padding"] < 1 and r["vs_limit"] > 0 for r in service)
    # the host side: the engine's interpreter lag (a reading every 10 ms), its process's cores and busiest threads
    assert all(r["interpreter_lag_ms"] >= 0 and r["engine_cores"] > 0 for r in service)
    assert "bert-runner-" in service[-1]["engine_threads"], service[-1]
    # a request's time nests: its queue wait inside the engine's round trip, that inside the front end's view of it
    assert all(0 <= r["queue_ms"] <= r["engine_round_trip_ms"] <= r["server_ms"] for r in service), service
    assert all(r["interpreter_lag_ms"] is None and r["engine_cores"] is None for r in rows if r["system"] == "naive")
    assert "| system | concurrency |" in result.stdout


def test_a_system_may_name_its_own_loads():
    every = [(16, 8), (64, 8), (64, 1)]
    assert own_loads("naive@64x8", every) == ("naive", [(64, 8)])
    assert own_loads("service::--no-cuda-graphs@64x8,64X1", every) == ("service::--no-cuda-graphs", [(64, 8), (64, 1)])
    assert own_loads("service:float32", every) == ("service:float32", every)
    assert own_loads("service::--api-key=a@b", every) == ("service::--api-key=a@b", every)  # not loads: a flag's


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
    from kernels.int8_modules import Int8GeluIntermediate, Int8Linear

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
    selecting, computing, replying = engine_us_per_input(load_checkpoint(tiny_checkpoint), texts, 8)
    assert selecting > 0 and computing > 0 and replying > 0


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


def test_cpu_batch_tokens_sweep_prints_a_row_per_shape(capsys):
    """bench.serving.cpu_batch_tokens: one row per shape, a timing per batch size, and what `auto` would choose."""
    import torch

    from bench.serving.cpu_batch_tokens import SIZES, main

    threads = torch.get_num_threads()
    try:
        assert main(["--shapes", "toy"]) == 0
    finally:  # main() times with one thread; the trainer tests after this one compare runs made with the default
        torch.set_num_threads(threads)
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| toy (64) |")]
    assert len(rows) == 1
    cells = [cell.strip() for cell in rows[0].strip("|").split("|")]
    assert cells[1] == "16384" and len(cells) == 2 + len(SIZES)
    assert min(float(cell.split(" (")[1].rstrip(")")) for cell in cells[2:]) == 1.0  # the row's best is itself


def test_server_cpu_reports_the_median_round_and_the_range():
    from bench.serving.server_cpu import Row, table

    rows = [Row(0, 8, 64, 1000.0 + i, ms, ms / 8, 1.0, 50.0, 90.0) for i, ms in enumerate((1.6, 1.2, 1.4))]
    rows.append(Row("floor", 8, 64, 9000.0, 0.05, 0.006, 0.9, 3.0, 8.0))
    rows.append(Row(2, 8, 64, 2000.0, 1.0, 0.125, 1.5, 30.0, 60.0, frontend_cpu_ms_per_sentence=0.0625))
    lines = table(rows, rounds=3).splitlines()
    assert len(lines) == 5 and lines[0].endswith("ms/request, range | ms/sentence, range |")
    assert lines[2].startswith("| 0 | 8 | 1,002 | 1.40 | 0.175 | – |") and lines[2].endswith("| 1.20-1.60 | 0.150-0.200 |")
    assert lines[3].startswith("| floor | 8 | 9,000 | 0.05 |")
    assert lines[4].startswith("| 2 | 8 | 2,000 | 1.00 | 0.125 | 0.062 |")  # the front ends' share, apart
    assert "range" not in table(rows[:1], rounds=1)


def test_engine_pipeline_over_a_stand_in_device(tiny_checkpoint):
    """The real batcher and runner over a device that sleeps: every round answers, the device's share and the
    rate against it stay within what the stand-in device can do."""
    from bench.serving.engine_pipeline import DeviceModel, measure

    device = DeviceModel(launch_us=50, batch_ms=0.5, sentence_us=10)
    found = measure(tiny_checkpoint, device, clients=8, per_request=4, outside_ms=1.0, seconds=1.0, batch_size=32)
    assert found.sentences_per_s > 0 and 0 < found.device_busy <= 1.05
    assert 0 < found.vs_device <= 1.05  # the device's own rate at full batches bounds it
    assert found.mean_batch >= 1 and found.queue_ms >= 0 and found.batch_ms >= device.batch_ms * 0.9
    assert found.interpreter_lag_ms >= 0 and found.host_us > 0
    assert found.quiet_p99_ms != found.quiet_p99_ms  # no second model asked for: NaN


def test_the_stand_in_launch_makes_its_calls_and_queues_its_batch_on_the_device():
    """Each launch makes `launch_calls` calls into torch (the interpreter given up in each, as in a CUDA call) and its
    batch ends on the device after the one launched before it."""
    from types import SimpleNamespace

    from bench.serving.engine_pipeline import DeviceModel, StandInDevice, StandInGpu

    device = StandInDevice(DeviceModel(launch_us=0, batch_ms=50, sentence_us=0))
    gpu = StandInGpu(None, device, width=4, launch_calls=3)
    first_ends, _ = gpu.launch(SimpleNamespace(size=2))
    second_ends, inputs = gpu.launch(SimpleNamespace(size=5))
    assert gpu.call_buffer[0].item() == 6 and inputs == 5
    assert second_ends - first_ends == pytest.approx(0.05, abs=1e-6) and gpu.waited_s > 0.04
    assert len(gpu.finish((second_ends, inputs))) == 5


@pytest.mark.parametrize("express_lane", [False, True], ids=["on-the-runner", "express-lane"])
def test_engine_pipeline_times_a_second_models_paced_requests_beside_the_flood(tiny_checkpoint, express_lane):
    from bench.serving.engine_pipeline import DeviceModel, measure

    device = DeviceModel(launch_us=50, batch_ms=0.5, sentence_us=10)
    found = measure(tiny_checkpoint, device, clients=8, per_request=4, outside_ms=1.0, seconds=1.5, batch_size=32,
                    quiet_rate=20, express_lane=express_lane)
    assert found.sentences_per_s > 0
    # each quiet request waits at least for its own batch on the device, and is answered well within the round
    assert device.seconds(16) * 1000 <= found.quiet_p50_ms <= found.quiet_p99_ms < 1000


def test_batch_selection_costs_both_queues_and_collation_here_and_in_a_base_checkout(tiny_checkpoint, tmp_path):
    """The preparer's parts alone: queueing and choosing both ways at each depth asked for, collating here and in the
    checkout given as the base (this one, so its figures are of the same code)."""
    from bench.serving.batch_selection import main

    out = tmp_path / "rows.json"
    assert main(["--checkpoint", str(tiny_checkpoint), "--rounds", "1", "--depths", "30", "--base", str(REPO_ROOT),
                 "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    for size, how in ((256, "unpriced (a GPU in bfloat16)"), (64, "priced (a CPU)")):
        for kept in ("kept by length", "sorted for each batch"):
            assert rows[f"batches of {size} {how}, 30 queued: queue + choose, {kept}"] > 0
        assert rows[f"batches of {size}: collate"] > 0 and rows[f"batches of {size}: collate, the base checkout"] > 0
    assert len(rows) == 8
