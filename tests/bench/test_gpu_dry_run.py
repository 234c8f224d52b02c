"""`python -m bench.gpu --dry-run`: every step of the GPU acceptance run (the GPU-marked tests, the service against
the in-process limit for both checkpoints with several client processes, the load generator's ceiling, py-spy,
torch.profiler, the trainer's tokens/s and MFU, the summary) on the CPU, so that the script cannot rot.
`devkit.gpu_venv_check` (slow, needs PyPI) rehearses it on a venv shaped like the GPU machine's Python."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.serving.throughput import auto_engine_dtype
from devkit.paths import REPO_ROOT


@pytest.mark.timeout(960)  # the subprocess's own limit (900 s), then the checks
def test_gpu_check_runs_every_step_on_the_cpu(tmp_path):
    result = subprocess.run([sys.executable, "-m", "bench.gpu", "--dry-run", "--out", str(tmp_path)], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    text = (tmp_path / "gpu-summary.json").read_text()
    summary = json.loads(text)
    assert "incomplete" not in summary  # the partial summary written after each step is replaced at the end
    tests = summary["gpu_tests"]
    assert tests["passed"] >= 4 and tests["failures"] == tests["errors"] == 0, tests
    rows = summary["serving"]["rows"] + summary["serving_base"]["rows"]
    systems = {r["system"] for r in rows}
    assert {"limit (in-process)", "service", "service:float32", "naive", "load generator (GET /live)"} <= systems
    # float32's own limit where the auto engine computes in another type (a GPU's bfloat16); on a CPU it is that one
    assert ("limit (in-process, float32)" in systems) == (auto_engine_dtype() != "float32")
    for row in rows:
        assert row["sequences_per_s"] > 0 or row["system"].startswith("load generator"), row
        if row["system"] in ("service", "service:float32"):
            assert 0 < row["vs_limit"] < 3, row
    assert summary["serving"]["client_processes"] >= 2
    assert any(note.startswith("in-process sequences/s by batch size") for note in summary["serving"]["notes"])
    assert summary["py_spy"].get("samples", 0) > 0 or "error" in summary["py_spy"]
    kernels = summary["kernels"]
    assert kernels["top"] and kernels["varlen_attention"] is False, kernels  # on the CPU: the padded/per-sequence path
    for name in ("bert-base", "train-default"):
        run = summary["training"][name]
        assert run["tokens_per_s"] > 0 and 0 < run["mfu_vs_measured_peak"], run
    assert summary["training"]["train-default"]["recipe_hours_here"] > 0
    without_graphs = summary["training_no_graphs"]["bert-base-no-graphs"]
    assert without_graphs["tokens_per_s"] > 0 and "--no-cuda-graphs" in without_graphs["flags"], without_graphs
    assert summary["environment"]["device"] == "cpu" and summary["matmul_peak_tflops"] > 0
    profile = summary["training_profile"]
    assert profile["wall_ms_per_step"] > 0 and profile["tokens_per_s"] > 0 and profile["top_kernels"], profile
    assert (tmp_path / "training-trace.json.gz").stat().st_size > 0
    for row in rows:  # where a service row's time went, from its /metrics
        if row["system"].startswith("service"):
            assert row["batch_ms"] > 0 and row["engine_busy"] > 0 and row["queue_ms"] >= 0, row
            assert row["interpreter_lag_ms"] >= 0 and row["engine_cores"] > 0, row
    report = (tmp_path / "gpu-summary.md").read_text()
    for machine_path in (str(REPO_ROOT), str(tmp_path), sys.prefix + "/"):  # summaries go into docs/gpu-runs/
        assert machine_path not in text and machine_path not in report, machine_path
    for line in ("GPU-marked tests", "bundled model: limit (in-process)", "BERT-base shape: ", "load generator",
                 "training (bert-base)", "training (bert-base-no-graphs)", "make train-default", "training profile",
                 "engine.run", "interpreter lag",
                 "in-process sequences/s by batch size"):
        assert line in report, line


@pytest.mark.parametrize("budget_minutes, left_out", [(0.0, ["py_spy", "kernels", "training_no_graphs"]),
                                                     (60.0, [])])
def test_steps_beside_the_asked_for_figures_wait_for_the_budget(budget_minutes, left_out, tmp_path, monkeypatch):
    """The steps themselves are stand-ins here (the dry run above runs the real ones): what is tested is which run."""
    from bench.gpu import __main__ as gpu_main
    from bench.gpu import steps as gpu_steps

    ran = []
    monkeypatch.setattr(gpu_main, "gpu_tests", lambda device, work: ran.append("gpu_tests") or {
        "tests": 1, "failures": 0, "errors": 0, "skipped": 0, "passed": 1, "seconds": 0.0, "exit_code": 0})
    monkeypatch.setattr(gpu_main, "matmul_peak_tflops", lambda device, dry_run: 1.0)
    monkeypatch.setattr(gpu_steps, "base_checkpoint", lambda work, dry_run: work)
    monkeypatch.setattr(gpu_steps, "serving", lambda checkpoint, *a: ran.append("serving") or {
        "rows": [], "client_processes": 2, "notes": []})
    monkeypatch.setattr(gpu_steps, "py_spy_profile", lambda *a: ran.append("py_spy") or {"error": "stand-in"})
    monkeypatch.setattr(gpu_steps, "kernel_profile", lambda *a: ran.append("kernels") or {"error": "stand-in"})
    monkeypatch.setattr(gpu_steps, "training", lambda device, work, dry_run, peak, base, names=gpu_steps.TRAINING_RUNS:
                        ran.append(names) or {})
    monkeypatch.setattr(gpu_steps, "training_profile", lambda *a: ran.append("training_profile") or {"error": "stand-in"})
    argv = ["--dry-run", "--out", str(tmp_path), "--budget-minutes", str(budget_minutes)]
    assert gpu_main.main(argv) == 0
    summary = json.loads((tmp_path / "gpu-summary.json").read_text())
    assert summary.get("skipped", []) == left_out
    assert (gpu_steps.WITHOUT_GRAPHS in ran) == (not left_out) and gpu_steps.TRAINING_RUNS in ran
    assert ("py_spy" in ran) == (not left_out)
    assert "training_profile" in ran and ran.count("serving") == 2  # the figures asked for run whatever the clock
    report = (tmp_path / "gpu-summary.md").read_text()
    assert ("left out, to end within the budget" in report) == bool(left_out)
    assert "Cut short" not in report  # the summary written after each step is replaced by the whole one
    assert "targets met" in report and "shown, not enforced" in report  # the dry run's verdicts: a CPU's figures
    # the stand-in tests all passed; the stand-in steps measured nothing: every other target is "not measured"
    assert [v["met"] for v in summary["verdicts"]] == [True] + [False] * 10
    assert {v["note"] for v in summary["verdicts"][1:]} == {"not measured"}
    ran.clear()  # named with --steps, a step runs whatever the budget
    assert gpu_main.main([*argv, "--steps", "training_no_graphs"]) == 0
    assert ran == [gpu_steps.WITHOUT_GRAPHS]


def test_wikitext_comes_from_the_repository_where_nothing_is_beside_it(tmp_path):
    """On the GPU machine only the repository and the folders carried with it arrive: no ../shared. There the copy
    in .data/wikitext-2 (docs/gpu.md) is WikiText-2, without BERT_WIKITEXT_DIR."""
    from devkit.paths import default_wikitext_dir

    shared, carried = tmp_path / "shared" / "wikitext-2", tmp_path / "repo" / ".data" / "wikitext-2"
    assert default_wikitext_dir(shared, carried) == shared  # neither there: the usual place, named in the error
    carried.mkdir(parents=True)
    assert default_wikitext_dir(shared, carried) == carried
    shared.mkdir(parents=True)
    assert default_wikitext_dir(shared, carried) == shared  # the data folder beside the checkout comes first


def test_a_run_without_wikitext_stops_before_its_first_step(tmp_path, monkeypatch, capsys):
    """Without WikiText-2 the serving steps and the trainer fail minutes into a GPU lease: the run says so at once."""
    from bench.gpu import __main__ as gpu_main

    monkeypatch.setattr(gpu_main, "WIKITEXT_VALID", tmp_path / "absent" / "wiki.valid.tokens")
    monkeypatch.setattr(gpu_main, "ensure_packages", lambda argv: pytest.fail("went on past the check"))
    assert gpu_main.main(["--dry-run", "--out", str(tmp_path / "out")]) == 2
    assert "WikiText-2 not found" in capsys.readouterr().err and not (tmp_path / "out").exists()
    assert gpu_main.wikitext_missing(["gpu_tests", "kernels"]) == []  # steps that do not read it need no copy


@pytest.mark.slow
@pytest.mark.timeout(1860)  # the subprocess's own limit (1800 s), then the checks
def test_gpu_check_on_a_venv_shaped_python(tmp_path):
    """A venv with only torch & co, `make gpu-wheels` (PyPI), then the dry run offline (devkit.gpu_venv_check)."""
    result = subprocess.run([sys.executable, "-m", "devkit.gpu_venv_check", "--keep", str(tmp_path)], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "GPU-marked tests" in result.stdout
