"""trainer.data.batches.BatchStream: built ahead by a worker process (the GPU path) or when asked (the CPU path),
the batches, masks and data cursors are those of calling training_batch step after step, from any step."""

from __future__ import annotations

import copy
import dataclasses
import json
import time

import pytest
import torch

from tests.trainer.conftest import tiny_run_args
from trainer.cli import build_parser
from trainer.data.batches import BatchStream, training_batch
from trainer.data.examples import TrainingPairs
from trainer.data.masking import NO_LABEL, replaceable_ids, slots_per_row
from trainer.data.pipeline import prepare
from trainer.options import TrainOptions
from trainer.state import Progress


@pytest.fixture(scope="module")
def setting(small_corpus, small_eval_corpus, tmp_path_factory):
    work = tmp_path_factory.mktemp("batches")
    args = tiny_run_args(small_corpus, small_eval_corpus, work / "out", work / "cache")
    options = TrainOptions(**vars(build_parser().parse_args(args)))
    data = prepare(options)
    pairs = TrainingPairs(data.train, options.max_seq_len, options.seed, options.short_seq_prob, data.weights)
    return options, data, pairs, replaceable_ids(data.tokenizer, data.tokenizer.vocab_size)


def one_by_one(setting, first: int, cursors, count: int):
    options, data, pairs, replace = setting
    progress = Progress(step=first, cursors=copy.deepcopy(cursors))
    out = []
    for _ in range(count):
        batch, masked = training_batch(pairs, progress, options, data, replace)
        out.append((batch, masked, copy.deepcopy(progress.cursors)))
        progress.step += 1
    return out


@pytest.mark.parametrize("ahead, workers", [(False, 1), (True, 1), (True, 3)],
                         ids=["when-asked", "worker-process", "three-worker-processes"])
def test_the_stream_is_training_batch_step_after_step(setting, ahead, workers):
    options, data, pairs, replace = setting
    # Not from the start: a resumed run starts at its step with its cursors.
    start = one_by_one(setting, 0, pairs.initial_cursors(), 3)[-1][2]
    expected = one_by_one(setting, 3, start, 7)  # more steps than workers: each worker builds two or three
    stream = BatchStream(pairs, 3, start, options, data, replace, ahead=ahead, workers=workers)
    try:
        for offset, (batch, masked, cursors) in enumerate(expected):
            taken = stream.next(3 + offset)
            assert taken.step == 3 + offset
            for name in ("input_ids", "token_type_ids", "attention_mask", "special_mask", "nsp_labels"):
                assert torch.equal(getattr(taken.batch, name), getattr(batch, name)), name
            for name in ("input_ids", "positions", "labels"):
                assert torch.equal(getattr(taken.masked, name), getattr(masked, name)), name
            assert taken.cursors == cursors
        assert expected[0][2] != expected[-1][2]  # the cursors do move: comparing them checks something
    finally:
        stream.close()
    # The stream worked on its own copy: the caller's cursors are as they were.
    assert start == one_by_one(setting, 0, pairs.initial_cursors(), 3)[-1][2]


def test_a_stream_out_of_step_fails_loudly(setting):
    options, data, pairs, replace = setting
    stream = BatchStream(pairs, 0, pairs.initial_cursors(), options, data, replace, ahead=False)
    with pytest.raises(RuntimeError, match="asked for step 1, built step 0"):
        stream.next(1)


def six_steps(stream: type[BatchStream], corpus, eval_corpus, output, monkeypatch) -> list[dict]:
    """The rows of metrics.jsonl of a tiny run of six steps whose batches come from `stream`."""
    import trainer.loop as loop

    monkeypatch.setattr(loop, "BatchStream", stream)
    args = tiny_run_args(corpus, eval_corpus, output, output.parent / "cache", **{"--max-steps": 6})
    loop.train(TrainOptions(**vars(build_parser().parse_args(args))))
    return [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]


def test_a_run_with_batches_built_ahead_is_the_same_run(small_corpus, small_eval_corpus, tmp_path, monkeypatch):
    """The worker path (a GPU's) trains exactly as the in-process one: same data, masks and dropout stream (a
    DataLoader drawing its seed from the global generator shifted the dropout stream: this caught it)."""
    rows = {}
    for ahead in (False, True):
        class Forced(BatchStream):
            def __init__(self, *args, ahead: bool = False, forced: bool = ahead, **kwargs):
                super().__init__(*args, ahead=forced, **kwargs)

        timing = ("tokens_per_s", "elapsed_s", "input_wait")
        rows[ahead] = [{k: v for k, v in row.items() if k not in timing}
                       for row in six_steps(Forced, small_corpus, small_eval_corpus, tmp_path / f"ahead-{ahead}",
                                            monkeypatch)]
    assert len(rows[False]) >= 3 and rows[True] == rows[False]


def test_the_time_spent_waiting_for_batches_is_logged(small_corpus, small_eval_corpus, tmp_path, monkeypatch):
    """metrics.jsonl's `input_wait` is the share of each logged window that the loop spent waiting for its next
    batch: most of it when batches come slowly, less when they do not."""
    waits = {}
    for delay in (0.0, 0.25):
        class Slow(BatchStream):
            def next(self, step: int, delay: float = delay):
                time.sleep(delay)
                return super().next(step)

        rows = six_steps(Slow, small_corpus, small_eval_corpus, tmp_path / f"delay-{delay}", monkeypatch)
        waits[delay] = [r["input_wait"] for r in rows if "input_wait" in r]
    assert waits[0.0] and all(0.0 <= w <= 1.0 for w in waits[0.0] + waits[0.25]), waits
    assert min(waits[0.25]) > 0.5 and min(waits[0.25]) > max(waits[0.0]), waits


def test_fixed_shapes_are_the_same_batch_padded_with_its_masks_in_slots(setting):
    """What a step replayed as CUDA graphs is given: the pairs and masks of the step as it would be, padded to
    --max-seq-len, each row's masked positions and their labels in `slots_per_row` places, spare ones on [CLS]."""
    options, data, pairs, replace = setting
    # Pairs built to 48 tokens, steps of 64: every row is padded, and the padding is exercised
    options = dataclasses.replace(options, max_seq_len=64)
    slots = slots_per_row(options.max_seq_len, options.mask_rate)
    for step in range(3):
        cursors = pairs.initial_cursors()
        batch, masked = training_batch(pairs, Progress(step=step, cursors=copy.deepcopy(cursors)), options, data, replace)
        fixed_batch, fixed = training_batch(pairs, Progress(step=step, cursors=copy.deepcopy(cursors)), options, data,
                                            replace, fixed_shapes=True)
        rows, width = batch.input_ids.shape
        assert fixed_batch.input_ids.shape == fixed.input_ids.shape == (rows, options.max_seq_len)
        for name in ("input_ids", "token_type_ids", "attention_mask", "special_mask"):
            assert torch.equal(getattr(fixed_batch, name)[:, :width], getattr(batch, name)), name
        assert fixed_batch.num_real_tokens == batch.num_real_tokens and torch.equal(fixed_batch.nsp_labels,
                                                                                     batch.nsp_labels)
        assert not fixed_batch.attention_mask[:, width:].any() and fixed_batch.special_mask[:, width:].all()
        assert torch.equal(fixed.input_ids[:, :width], masked.input_ids) and not fixed.positions[:, width:].any()
        assert torch.equal(fixed.labels, masked.labels)
        assert fixed.slots.shape == fixed.slot_labels.shape == (rows, slots)
        filled = fixed.slot_labels != NO_LABEL
        assert torch.equal(filled.sum(1), masked.positions.sum(1))
        assert torch.equal(fixed.slots[filled], masked.positions.nonzero()[:, 1])  # row-major, as `labels`
        assert torch.equal(fixed.slot_labels[filled], masked.labels) and (fixed.slots[~filled] == 0).all()
        assert masked.slots is None


def test_the_worker_process_hands_over_fixed_shapes(setting):
    options, data, pairs, replace = setting
    progress = Progress(step=0, cursors=pairs.initial_cursors())
    _, expected = training_batch(pairs, progress, options, data, replace, fixed_shapes=True)
    stream = BatchStream(pairs, 0, pairs.initial_cursors(), options, data, replace, ahead=True, fixed_shapes=True)
    try:
        taken = stream.next(0)
    finally:
        stream.close()
    assert torch.equal(taken.masked.slots, expected.slots) and torch.equal(taken.masked.slot_labels,
                                                                          expected.slot_labels)
