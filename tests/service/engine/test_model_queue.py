"""A model's queue kept by length must take exactly the batches that `choose_batch` chooses from the same entries
kept plainly in arrival order, through any mix of arrivals, batches taken and entries removed; and say what it holds
(count, tokens, oldest) as the plain list would."""

from __future__ import annotations

import random
from functools import partial

import pytest

from model import BertConfig
from model.flops import packed_batch_flops
from service.engine.batch_choice import choose_batch
from service.engine.batcher import BatchPolicy, Entry, Ticket
from service.engine.model_queue import ModelQueue

CONFIG = BertConfig(vocab_size=100, hidden_size=384, num_hidden_layers=6, num_attention_heads=2, intermediate_size=1536)


def request(rng: random.Random, spread: int) -> list[Entry]:
    ticket = Ticket(deadline=rng.random(), size=0, sink=None)
    return [Entry([1] * rng.randint(3, spread), ticket, index) for index in range(rng.randint(1, 12))]


@pytest.mark.parametrize("seed", range(8))
def test_batches_taken_are_the_plain_choice(seed):
    rng = random.Random(seed)
    queue, plain = ModelQueue(), []
    policy = BatchPolicy(max_batch_tokens=rng.choice([512, 4096, 16384]), max_batch_size=rng.choice([4, 16, 64, 256]),
                         max_padding_fraction=rng.choice([0.05, 0.1, 1.0]))
    flops = rng.choice([None, partial(packed_batch_flops, CONFIG)])
    spread = rng.choice([6, 40, 300])  # a few lengths, each with many entries; or many lengths
    taken = 0
    for _ in range(400):
        action = rng.random()
        if action < 0.5 or not plain:
            entries = request(rng, spread)
            assert queue.add(entries) == sum(e.length for e in entries)
            plain += entries
        elif action < 0.95:
            target = rng.choice([None, None, rng.randint(20, 3000)])
            expected = choose_batch(plain, policy, flops, target)
            chosen, tokens = queue.take(policy, flops, target)
            assert tokens == sum(e.length for e in chosen)
            assert [id(e) for e in chosen] == [id(e) for e in expected]
            plain = [e for e in plain if all(e is not c for c in chosen)]
            taken += 1
        else:  # the requests past a deadline (or cancelled) go
            cut = rng.random()
            removed = queue.remove_where(lambda e: e.ticket.deadline < cut)
            assert [id(e) for e in removed] == [id(e) for e in plain if e.ticket.deadline < cut]
            plain = [e for e in plain if e.ticket.deadline >= cut]
        assert len(queue) == len(plain) and queue.tokens == sum(e.length for e in plain)
        assert sorted(map(id, queue)) == sorted(map(id, plain))
        if plain:
            assert queue.oldest() is plain[0]
    assert taken > 100


def test_a_batch_takes_from_the_middle_of_long_runs_of_one_length():
    """The window holds a batch's size of entries on each side of the oldest only: the longest input first (its batch
    is the next shorter ones, the newest of their lengths), then the oldest of one length among hundreds of others,
    come out as the plain choice says, and the rest stay in order."""
    policy = BatchPolicy(max_batch_tokens=100_000, max_batch_size=8)
    ticket = Ticket(deadline=1.0, size=0, sink=None)
    queue, plain = ModelQueue(), []
    for lengths in ([40], [10] * 50, [20] * 300, [30] * 5):
        entries = [Entry([1] * n, ticket, i) for i, n in enumerate(lengths)]
        queue.add(entries)
        plain += entries
    while plain:
        chosen, _ = queue.take(policy, None)
        assert chosen == choose_batch(plain, policy, None)
        plain = [e for e in plain if all(e is not c for c in chosen)]
    assert len(queue) == 0 and queue.tokens == 0 and list(queue) == []
