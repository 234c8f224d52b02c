"""bench.gpu's py-spy summary: each function's share, and how many cores each thread of each process kept busy
(py-spy's raw format with --subprocesses --threads, as recorded from a parent and a child process)."""

from __future__ import annotations

import pytest

from bench.gpu.steps import summarize_stacks

RAW = [
    'process 10:"python -m service";thread (10): MainThread;run (a.py:1);poll (zmq.py:9) 50',
    'process 10:"python -m service";process 11:"python -m engine";thread (11): bert-runner-0;run (b.py:2);'
    'forward (linear.py:3) 300',
    'process 10:"python -m service";process 11:"python -m engine";thread (11): bert-runner-0;run (b.py:2);'
    'to (packing.py:4) 100',
    'process 10:"python -m service";process 12:"python -m frontend";thread (12): MainThread;serve (c.py:5) 150',
    "not a stack line",
]


def test_shares_and_busy_cores_per_thread():
    summary = summarize_stacks(RAW, samples_per_busy_thread=400)  # e.g. 4 s at 100 samples/s
    assert summary["samples"] == 600
    assert summary["self"][0] == {"function": "forward (linear.py:3)", "share": 0.5}
    assert {f["function"] for f in summary["inclusive"]} >= {"run (b.py:2)", "serve (c.py:5)"}
    assert not any(f["function"].startswith(("process ", "thread (")) for f in summary["inclusive"])
    threads = {t["thread"]: t for t in summary["threads"]}
    assert threads["11 bert-runner-0"]["busy_cores"] == pytest.approx(1.0)  # the child's pid, not the parent's
    assert threads["11 bert-runner-0"]["top"][0] == "forward (linear.py:3)"
    assert threads["12 MainThread"]["busy_cores"] == pytest.approx(0.375)
    assert threads["10 MainThread"]["busy_cores"] == pytest.approx(0.125)
    assert summary["busy_cores"] == pytest.approx(1.5)


def test_without_thread_frames_there_is_no_per_thread_figure():
    summary = summarize_stacks(["run (a.py:1);leaf (a.py:2) 10"], samples_per_busy_thread=100)
    assert summary["samples"] == 10 and "threads" not in summary
