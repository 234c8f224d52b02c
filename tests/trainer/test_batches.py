"""trainer.batches.BatchStream: built ahead by a worker process (the GPU path) or when asked (the CPU path),
the batches, masks and data cursors are those of calling training_batch step after step, from any step."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from trainer.batches import BatchStream, training_batch
from trainer.cli import build_parser
from trainer.data import prepare
from trainer.examples import TrainingPairs
from trainer.masking import replaceable_ids
from trainer.options import TrainOptions
from trainer.state import Progress
from tests.trainer.conftest import tiny_run_args


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


@pytest.mark.parametrize("ahead", [False, True], ids=["when-asked", "worker-process"])
def test_the_stream_is_training_batch_step_after_step(setting, ahead):
    options, data, pairs, replace = setting
    # Not from the start: a resumed run starts at its step with its cursors.
    start = one_by_one(setting, 0, pairs.initial_cursors(), 3)[-1][2]
    expected = one_by_one(setting, 3, start, 4)
    stream = BatchStream(pairs, 3, start, options, data, replace, ahead=ahead)
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


def test_a_run_with_batches_built_ahead_is_the_same_run(small_corpus, small_eval_corpus, tmp_path, monkeypatch):
    """The worker path (a GPU's) trains exactly as the in-process one: same data, masks and dropout stream (a
    DataLoader drawing its seed from the global generator shifted the dropout stream: this caught it)."""
    import trainer.loop as loop

    rows = {}
    for ahead in (False, True):
        class Forced(BatchStream):
            def __init__(self, *args, ahead: bool = False, forced: bool = ahead):
                super().__init__(*args, ahead=forced)

        monkeypatch.setattr(loop, "BatchStream", Forced)
        output = tmp_path / f"ahead-{ahead}"
        args = tiny_run_args(small_corpus, small_eval_corpus, output, tmp_path / "cache", **{"--max-steps": 6})
        loop.train(TrainOptions(**vars(build_parser().parse_args(args))))
        timing = ("tokens_per_s", "elapsed_s")
        rows[ahead] = [{k: v for k, v in json.loads(line).items() if k not in timing}
                       for line in (output / "metrics.jsonl").read_text().splitlines()]
    assert len(rows[False]) >= 3 and rows[True] == rows[False]
