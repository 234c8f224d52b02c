"""Batch selection: anchored on the oldest input, length-aware, within every cap. No model needed:
selection is a pure function of the queue, the policy and the FLOP model."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from model.flops import packed_batch_flops
from service.engine.batch_choice import choose_batch
from service.engine.batcher import Batcher, BatchPolicy, Entry, Ticket
from service.metrics import Metrics
from tests.conftest import tiny_config


class Queue:
    """A queue of entries of given lengths; `_select()` takes the next batch out of it, as the preparer does."""

    def __init__(self, policy: BatchPolicy, lengths: list[int]):
        ticket = Ticket(deadline=1e18, size=len(lengths), sink=None)
        self.policy = policy
        self._queue = [Entry([1] * n, ticket, index) for index, n in enumerate(lengths)]
        self.flops = partial(packed_batch_flops, tiny_config(300))  # prices padding as the engine does

    def _select(self) -> list[Entry]:
        chosen = choose_batch(self._queue, self.policy, self.flops)
        self._queue = [e for e in self._queue if all(e is not c for c in chosen)]
        return chosen


def policy(**caps) -> BatchPolicy:
    values = dict(max_batch_tokens=4096, max_batch_size=64, max_wait_s=0, max_queue_items=1000,
                  max_padding_fraction=0.15)
    values.update(caps)
    return BatchPolicy(**values)


def batcher(**caps) -> Queue:
    return Queue(policy(**caps), [])


def queue(b: Queue, lengths: list[int]) -> None:
    b._queue = Queue(b.policy, lengths)._queue


def test_lengths_far_apart_go_to_separate_batches():
    b = batcher()
    queue(b, [10, 100, 11, 98, 12, 100, 10])
    first = sorted(e.length for e in b._select())
    assert first == [10, 10, 11, 12]  # the oldest (10) and its neighbours; the long ones wait for the next batch
    assert sorted(e.length for e in b._select()) == [98, 100, 100]
    assert not b._queue


def test_caps_on_tokens_and_sequences_hold():
    b = batcher(max_batch_tokens=100, max_padding_fraction=1.0)
    queue(b, [30] * 10)
    assert len(b._select()) == 3  # 4 x 30 would exceed 100 tokens
    b = batcher(max_batch_size=2)
    queue(b, [30] * 10)
    assert len(b._select()) == 2


def test_short_inputs_of_any_mix_share_a_batch():
    # Packed batches: padding costs attention work only, which is small next to the token-wise layers
    # when every input is short, so a mixed queue of short inputs goes out as one batch.
    b = batcher()
    queue(b, [3, 12, 7, 16, 5, 9])
    assert len(b._select()) == 6


def test_the_oldest_input_is_always_served_first():
    b = batcher()
    queue(b, [500, 10, 10, 10])
    assert [e.length for e in b._select()] == [500]


def test_compute_threads_run_at_the_asked_niceness():
    """Linux: the runner threads are niced so the event loop keeps answering under a flood; the
    calling thread (the HTTP side) keeps its priority."""
    import os
    import threading
    import time

    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    before = set(threading.enumerate())  # runners another test left running are not this batcher's
    b = Batcher(engine=None, policy=policy(runners=2, runner_niceness=7), metrics=Metrics())
    b.start()
    try:
        runners = [t for t in set(threading.enumerate()) - before if t.name.startswith("bert-runner-")]
        assert len(runners) == 2
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(
                os.getpriority(os.PRIO_PROCESS, t.native_id) != max(base, 7) for t in runners):
            time.sleep(0.01)  # each thread sets its own priority as it starts
        assert [os.getpriority(os.PRIO_PROCESS, t.native_id) for t in runners] == [max(base, 7)] * 2
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == base
        # ... and carry their names at the OS level, for top -H, py-spy and bench.serving.cpu_budget
        os_names = {Path(f"/proc/self/task/{t.native_id}/comm").read_text().strip() for t in runners}
        assert os_names == {"bert-runner-0", "bert-runner-1"}
    finally:
        b.stop()


def test_cpu_batch_size_is_the_largest_within_reach_of_the_fastest(monkeypatch):
    """`--cpu-batch-tokens measure`: a measured curve whose time per token is lowest at 1024 tokens and rises past it
    (on a simulated clock, so the test does not depend on this machine's load)."""
    import service.engine.batch_size
    from service.engine.batch_size import measure_batch_tokens

    per_token_s = {256: 20e-6, 512: 12e-6, 1024: 10e-6, 2048: 10.5e-6, 4096: 15e-6}
    clock = [0.0]
    monkeypatch.setattr(service.engine.batch_size.time, "perf_counter", lambda: clock[0])

    class CurveEngine:
        def collate(self, items):
            return sum(len(i) for i in items)

        def run(self, tokens):
            clock[0] += per_token_s[tokens] * tokens

    assert measure_batch_tokens(CurveEngine(), 7, 2, 3, ceiling=16384) == 2048  # within 10% of 1024's time
    assert measure_batch_tokens(CurveEngine(), 7, 2, 3, ceiling=16384, tolerance=0.01) == 1024
    assert measure_batch_tokens(CurveEngine(), 7, 2, 3, ceiling=600) == 512  # never past the ceiling


def test_cpu_batch_size_by_default_follows_the_feed_forward_width():
    """`--cpu-batch-tokens auto`: the widest activation of a batch fits ACTIVATION_BYTES (6 MiB)."""
    from service.engine.batch_size import batch_tokens_for_width

    assert batch_tokens_for_width(1536, 4, 16384) == 1024  # all-MiniLM-L6-v2, the bundled model
    assert batch_tokens_for_width(3072, 4, 16384) == 512  # BERT-base
    assert batch_tokens_for_width(3072, 2, 16384) == 1024  # BERT-base in bfloat16: half the bytes
    assert batch_tokens_for_width(64, 4, 16384) == 16384  # a toy model: the whole budget, its fixed cost dominates
    assert batch_tokens_for_width(64, 4, 4000) == 4000  # never past max_batch_tokens
    assert batch_tokens_for_width(1 << 20, 4, 16384) == 256  # absurdly wide: still a useful batch
    assert batch_tokens_for_width(1 << 20, 4, 100) == 100
