"""Work that finds a CPU runner idle is split evenly over the runners (`batch_choice.even_split`, `Batcher._choose`):
a request that fits one batch runs on every runner at once, a larger one ends at about the same time on each, and
work that arrives while every runner is busy is batched as before."""

from __future__ import annotations

import time

from service.engine.batch_choice import SPLIT_FILL, even_split
from service.engine.batcher import BatchPolicy
from tests.service.engine.test_idle_runner import HostEngine, answered, ask, gated, started
from tests.service.engine.test_overlapped_batches import Collected

POLICY = BatchPolicy(max_batch_tokens=1000, max_batch_size=64)


def test_one_runner_is_never_split_for():
    assert even_split(900, 30, POLICY, runners=1, busy=0) is None


def test_no_split_when_every_runner_is_busy_or_there_is_one_input():
    assert even_split(900, 30, POLICY, runners=2, busy=2) is None
    assert even_split(900, 1, POLICY, runners=2, busy=0) is None


def test_what_fits_one_batch_goes_to_every_idle_runner():
    assert even_split(300, 10, POLICY, runners=2, busy=0) == 2
    assert even_split(300, 10, POLICY, runners=4, busy=0) == 4
    assert even_split(300, 10, POLICY, runners=2, busy=1) is None  # one batch for the one idle runner


def test_batches_fill_whole_rounds_of_the_runners_within_the_budget():
    for tokens in range(100, 20_000, 137):
        for busy in (0, 1):
            batches = even_split(tokens, 50, POLICY, runners=2, busy=busy)  # the sequence cap never binds
            if batches is None:
                assert busy == 1 and tokens <= POLICY.max_batch_tokens * SPLIT_FILL
                continue
            assert (batches + busy) % 2 == 0
            assert tokens / batches <= POLICY.max_batch_tokens * SPLIT_FILL
            assert batches <= 2 or tokens / (batches - 2) > POLICY.max_batch_tokens * SPLIT_FILL  # no more than needed


def test_the_sequence_cap_counts_too_and_no_batch_is_empty():
    assert even_split(100, 200, POLICY, runners=2, busy=0) == 4  # 200 inputs, 64 a batch at most
    assert even_split(500, 3, BatchPolicy(max_batch_tokens=100, max_batch_size=64), runners=2, busy=0) == 3


def wait_for(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.001)
    assert condition()


def test_a_request_alone_runs_on_both_runners_at_once_in_equal_halves():
    engine, sink, batcher = gated(runners=2)
    try:
        items = [[n] * 10 for n in range(1, 9)]  # 8 inputs of 10 tokens: one batch's worth
        ticket = ask(batcher, sink, items)
        wait_for(lambda: engine.entered == 2)  # both runners are computing a part of it
        engine.gate.set()
        answered(sink, 1)
        assert sorted(len(batch) for batch in engine.batches) == [4, 4]
        assert ticket.results == [10 * n for n in range(1, 9)]  # each input's answer in its place
    finally:
        engine.gate.set()
        batcher.stop()


def test_a_larger_request_ends_at_the_same_time_on_both_runners():
    engine, sink = HostEngine(), Collected()
    batcher = started(engine, runners=2, max_batch_size=8)  # 21 inputs: 3 batches at least, so 4 of 5-6 inputs
    try:
        items = [[1] * (5 + n % 3) for n in range(21)]
        ticket = ask(batcher, sink, items)
        answered(sink, 1)
        sizes = [len(batch) for batch in engine.batches]
        assert len(sizes) == 4 and max(sizes) - min(sizes) <= 2, sizes
        assert ticket.results == [len(item) for item in items]
    finally:
        batcher.stop()


def test_work_that_comes_while_every_runner_is_busy_is_batched_whole():
    engine, sink, batcher = gated(runners=2)
    try:
        ask(batcher, sink, [[1] * 10, [1] * 10])  # split: one input on each runner, both held at the gate
        wait_for(lambda: engine.entered == 2)
        waiting = ask(batcher, sink, [[2] * 10 for _ in range(8)])
        wait_for(lambda: batcher.prepared is not None)  # chosen while both runners were computing
        engine.gate.set()
        answered(sink, 2)
        assert sorted(len(batch) for batch in engine.batches) == [1, 1, 8]
        assert waiting.results == [20] * 8
    finally:
        engine.gate.set()
        batcher.stop()
