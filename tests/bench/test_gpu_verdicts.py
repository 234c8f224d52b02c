"""The acceptance run's verdicts (bench.gpu.verdicts) on stand-in figures: each target judged from the summary, a
missed or unmeasured target and a skipped or uncollected GPU-marked test fail the run on a GPU; `--judge` re-judges
a stored summary with the same logic."""

from __future__ import annotations

import copy
import json

import pytest

from bench.gpu import __main__ as gpu_main
from bench.gpu.verdicts import missed, verdicts


def row(system: str, load: str, per_s: float, vs_limit: float | None = None) -> dict:
    clients, inputs = (int(p) for p in load.split("x"))
    return {"system": system, "concurrency": clients, "inputs_per_request": inputs, "sequences_per_s": per_s,
            "vs_limit": vs_limit}


def passing() -> dict:
    """A summary where every target is met, by a margin."""
    bundled = [row("limit (in-process)", "0x0", 60000), row("service", "64x8", 54000, 0.9),
               row("service", "64x1", 33000, 0.55), row("service:float32", "64x8", 30000, 0.95),
               row("naive", "64x8", 300), row("service::--no-cuda-graphs", "64x8", 20000, 0.33),
               row("service::--no-cuda-graphs", "64x1", 9000, 0.15)]
    base = [row("service", "64x8", 27000, 0.85), row("service", "64x1", 17000, 0.52),
            row("service:float32", "64x8", 6000, 0.9), row("naive", "64x8", 80)]
    return {"dry_run": False, "gpu_tests": {"tests": 14, "failures": 0, "errors": 0, "skipped": 0, "passed": 14,
                                            "exit_code": 0},
            "serving": {"rows": bundled}, "serving_base": {"rows": base},
            "training": {"bert-base": {"mfu_vs_measured_peak": 0.43}}}


def test_every_target_met():
    found = verdicts(passing())
    assert len(found) == 11 and missed(found) == [], found


def spoil(summary: dict, how: str) -> None:
    rows = {k: summary[k]["rows"] for k in ("serving", "serving_base")}
    if how == "service 64x8 vs limit":
        rows["serving"][1]["vs_limit"] = 0.79
    elif how == "service 64x1 vs limit":
        rows["serving_base"][1]["vs_limit"] = 0.49
    elif how == "vs naive":
        rows["serving_base"][3]["sequences_per_s"] = 27000 / 19.9
    elif how == "bfloat16 vs float32":
        rows["serving_base"][2]["sequences_per_s"] = 27001
    elif how == "graphs vs eager":
        rows["serving"][6]["sequences_per_s"] = 33001
    elif how == "mfu":
        summary["training"]["bert-base"]["mfu_vs_measured_peak"] = 0.399
    elif how == "a test skipped":
        summary["gpu_tests"].update(skipped=1, passed=13)
    elif how == "nothing collected":
        summary["gpu_tests"].update(tests=0, passed=0, exit_code=5)
    elif how == "a row missing":
        del rows["serving"][3]
    elif how == "a step failed":
        summary["training"] = {"bert-base": {"error": "boom"}}


CASES = {"service 64x8 vs limit": "bundled model: service at 64x8",
         "service 64x1 vs limit": "BERT-base shape: service at 64x1",
         "vs naive": "vs naive", "bfloat16 vs float32": "BERT-base shape: bfloat16 vs float32",
         "graphs vs eager": "CUDA graphs vs eager at 64x1", "mfu": "trainer MFU", "a test skipped": "GPU-marked tests",
         "nothing collected": "GPU-marked tests", "a row missing": "bundled model: bfloat16 vs float32",
         "a step failed": "trainer MFU"}


@pytest.mark.parametrize("how", CASES)
def test_one_target_missed_fails_that_target_alone(how):
    summary = copy.deepcopy(passing())
    spoil(summary, how)
    found = missed(verdicts(summary))
    assert len(found) == 1 and CASES[how] in found[0], found


@pytest.mark.parametrize("how", ["mfu", "a test skipped", "nothing collected"])
def test_a_missed_target_fails_the_run_on_a_gpu_not_the_dry_run(how):
    summary = copy.deepcopy(passing())
    summary["verdicts"] = verdicts(summary)
    assert gpu_main.failed(summary) == []
    spoil(summary, how)
    summary["verdicts"] = verdicts(summary)
    assert any(f.startswith("target: ") for f in gpu_main.failed(summary))
    summary["dry_run"] = True  # on the CPU the GPU-marked tests skip and the figures are a CPU's: shown, not judged
    assert not any(f.startswith("target: ") for f in gpu_main.failed(summary))


def test_judge_a_stored_summary(tmp_path, capsys):
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(passing()))
    summary = passing()
    spoil(summary, "graphs vs eager")
    bad.write_text(json.dumps(summary))
    assert gpu_main.main(["--judge", str(good)]) == 0 and "11 of 11 targets met" in capsys.readouterr().out
    assert gpu_main.main(["--judge", str(bad)]) == 1
    assert "MISSED" in capsys.readouterr().out


def test_a_run_of_some_steps_is_judged_on_what_it_measured():
    """`--steps serving` (a second look): the targets it did not measure are shown as such, not failed; a target it
    measured and missed still fails."""
    summary = copy.deepcopy(passing())
    del summary["training"], summary["gpu_tests"]
    summary["some_steps"] = True
    summary["verdicts"] = verdicts(summary)
    assert sum(not v["met"] for v in summary["verdicts"]) == 2 and gpu_main.failed(summary) == []
    spoil(summary, "graphs vs eager")
    summary["verdicts"] = verdicts(summary)
    assert gpu_main.failed(summary) == ["target: bundled model: CUDA graphs vs eager at 64x1"]
    summary["some_steps"] = False  # the whole run: what it did not measure fails too
    assert len(gpu_main.failed(summary)) == 3
