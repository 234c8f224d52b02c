"""A compiled step that fails (its compilation, or the capture of its CUDA graphs) trains eagerly and says so, in
the log and in the run's metadata; and resumable checkpoints by the clock (--save-every-minutes)."""

from __future__ import annotations

import json
import logging
import math

import torch

import trainer.loop as loop
from tests.trainer.conftest import tiny_run_args
from trainer.cli import main


class CaptureRefused(torch.nn.Module):
    """A compiled step whose every call raises, as a CUDA-graph capture the driver refuses does."""

    def __init__(self, step):
        super().__init__()
        self.step = step
        self.calls = 0

    def forward(self, *args, **kwargs):
        self.calls += 1
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing")


def test_a_failing_compiled_step_trains_eagerly_and_says_so(tmp_path, small_corpus, small_eval_corpus, monkeypatch,
                                                             caplog):
    refused = []
    monkeypatch.setattr(loop, "compile_forward", lambda step, **kw: refused.append(CaptureRefused(step)) or refused[-1])
    output = tmp_path / "out"
    with caplog.at_level(logging.WARNING, logger="trainer"):
        assert main(tiny_run_args(small_corpus, small_eval_corpus, output, tmp_path / "cache", **{
            "--max-steps": 6, "--compile": True, "--save-every": 100})) == 0
    assert refused and refused[0].calls == 1  # tried once, then never again
    assert "the compiled step failed at step 0 (RuntimeError: CUDA error: operation not permitted" in caplog.text
    metadata = json.loads((output / "training_metadata.json").read_text())
    assert metadata["compiled_step"]["compiled"] is True
    assert metadata["compiled_step"]["fell_back"].startswith("RuntimeError: CUDA error")
    rows = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    losses = [r for r in rows if "loss" in r]
    assert losses[-1]["step"] == 6 and not any(math.isnan(r["loss"]) for r in losses)  # trained to the end


def test_an_eager_run_records_no_fallback(tmp_path, small_corpus, small_eval_corpus):
    output = tmp_path / "out"
    assert main(tiny_run_args(small_corpus, small_eval_corpus, output, tmp_path / "cache", **{"--max-steps": 2})) == 0
    metadata = json.loads((output / "training_metadata.json").read_text())
    assert metadata["compiled_step"] == {"compiled": False, "cuda_graphs": False, "fell_back": None}


def test_checkpoints_by_the_clock(tmp_path, small_corpus, small_eval_corpus, monkeypatch):
    """--save-every-minutes: a resumable checkpoint whenever that much wall-clock has passed, whatever the steps."""
    clock = iter(range(0, 10**6, 7))  # 7 s a reading: a save is due every few steps at 0.5 minutes
    real = loop.time.perf_counter
    monkeypatch.setattr(loop.time, "perf_counter", lambda: float(next(clock)))
    saved = []
    original = loop.Training._save_resumable
    monkeypatch.setattr(loop.Training, "_save_resumable",
                        lambda self: (saved.append(self.progress.step), original(self))[1])
    output = tmp_path / "out"
    assert main(tiny_run_args(small_corpus, small_eval_corpus, output, tmp_path / "cache", **{
        "--max-steps": 12, "--save-every": 1000, "--save-every-minutes": 0.5})) == 0
    assert real is not None and len(saved) >= 3 and saved[-1] == 12 and all(0 < s < 12 for s in saved[:-1])
