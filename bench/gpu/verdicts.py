"""What `python -m bench.gpu` must show on a GPU, and whether it did: one verdict per target, from the summary.

The targets (issue #53): the service at >= 0.8x the in-process limit at 64 clients x 8 sentences and >= 0.5x at
64 x 1 (bfloat16, the bundled model and the BERT-base shape); >= 20x the naive `transformers` peer (BERT-base,
64 x 8); bfloat16 serving >= float32; CUDA graphs >= eager (the bundled model, 64 x 8 and 64 x 1); the trainer at
>= 40% MFU on the BERT-base shape. And the GPU-marked tests: every one ran and passed (a skip, or none collected,
fails the run: a test that did not run proves nothing).

A target whose figure is missing (its step failed, or was left out) is "not measured", which fails the run too.
"""

from __future__ import annotations

VS_LIMIT = {"64x8": 0.8, "64x1": 0.5}
VS_NAIVE = 20.0
MFU = 0.40
CHECKPOINTS = (("serving", "bundled model"), ("serving_base", "BERT-base shape"))
EAGER_SYSTEM = "service::--no-cuda-graphs"


def _row(summary: dict, step: str, system: str, load: str) -> dict | None:
    clients, inputs = (int(part) for part in load.split("x"))
    for row in summary.get(step, {}).get("rows", []):
        if row["system"] == system and row["concurrency"] == clients and row["inputs_per_request"] == inputs:
            return row
    return None


def _verdict(target: str, value: float | None, needed: float, unit: str = "x") -> dict:
    if value is None:
        return {"target": target, "value": None, "needed": needed, "met": False, "note": "not measured"}
    return {"target": target, "value": round(value, 4), "needed": needed, "met": value >= needed,
            "note": f"{value:.2f}{unit} (needs >= {needed:g}{unit})"}


def _ratio(a: dict | None, b: dict | None) -> float | None:
    if a is None or b is None or not b.get("sequences_per_s"):
        return None
    return a["sequences_per_s"] / b["sequences_per_s"]


def gpu_tests_verdict(tests: dict | None) -> dict:
    """Every GPU-marked test collected ran and passed: a skip or an empty collection fails."""
    if not tests:
        return {"target": "GPU-marked tests all run and pass", "value": None, "needed": None, "met": False,
                "note": "not run"}
    ran = tests["tests"] - tests["skipped"]
    met = tests["tests"] > 0 and tests["skipped"] == 0 and tests["failures"] + tests["errors"] == 0 \
        and tests["exit_code"] == 0
    note = f"{tests['passed']} passed, {tests['failures'] + tests['errors']} failed, {tests['skipped']} skipped of " \
           f"{tests['tests']} collected" + ("" if tests["tests"] else " (nothing collected)")
    return {"target": "GPU-marked tests all run and pass", "value": ran, "needed": tests["tests"], "met": met,
            "note": note}


def verdicts(summary: dict) -> list[dict]:
    """Every target's verdict, in the order the issue lists them."""
    found = [gpu_tests_verdict(summary.get("gpu_tests"))]
    for step, label in CHECKPOINTS:
        for load, needed in VS_LIMIT.items():
            row = _row(summary, step, "service", load)
            found.append(_verdict(f"{label}: service at {load} vs the in-process limit (bfloat16)",
                                  None if row is None else row.get("vs_limit"), needed))
    found.append(_verdict("BERT-base shape: service vs naive transformers at 64x8",
                          _ratio(_row(summary, "serving_base", "service", "64x8"),
                                 _row(summary, "serving_base", "naive", "64x8")), VS_NAIVE))
    for step, label in CHECKPOINTS:
        found.append(_verdict(f"{label}: bfloat16 vs float32 at 64x8",
                              _ratio(_row(summary, step, "service", "64x8"),
                                     _row(summary, step, "service:float32", "64x8")), 1.0))
    for load in VS_LIMIT:
        found.append(_verdict(f"bundled model: CUDA graphs vs eager at {load}",
                              _ratio(_row(summary, "serving", "service", load),
                                     _row(summary, "serving", EAGER_SYSTEM, load)), 1.0))
    run = summary.get("training", {}).get("bert-base", {})
    mfu = run.get("mfu_vs_measured_peak")
    found.append(_verdict("trainer MFU, BERT-base shape (bfloat16, compiled, CUDA graphs)",
                          None if mfu is None else 100 * mfu, 100 * MFU, "%"))
    return found


def verdict_lines(found: list[dict]) -> list[str]:
    """The Markdown table of the verdicts."""
    lines = ["", "| target | verdict |", "| --- | --- |"]
    lines += [f"| {v['target']} | {'met' if v['met'] else 'MISSED'}: {v['note']} |" for v in found]
    met = sum(v["met"] for v in found)
    lines += ["", f"**{met} of {len(found)} targets met.**"]
    return lines


def missed(found: list[dict]) -> list[str]:
    return [v["target"] for v in found if not v["met"]]
