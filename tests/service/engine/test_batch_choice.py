"""`choose_batch` written out for speed must choose exactly what its rule, written plainly, chooses: the oldest
entry, then step by step the neighbour in length order (shorter or longer) whose batch wastes the smaller share of
its FLOPs on padding (the longer one on a tie), while the token budget, the size cap and the padding cap hold, and,
given a target of real tokens (an even split over the runners), while the neighbour brings the batch nearer it."""

from __future__ import annotations

import random
from functools import partial

import pytest

from model import BertConfig
from model.flops import packed_batch_flops
from service.engine.batch_choice import choose_batch
from service.engine.batcher import BatchPolicy, Entry, Ticket


def plainly_chosen(queue: list[Entry], policy: BatchPolicy, flops, target_tokens: int | None = None) -> list[Entry]:
    """The rule as a reader states it: every candidate priced afresh, the options compared as a list."""
    by_length = sorted(queue, key=lambda e: e.length)
    lo = by_length.index(queue[0])
    hi = lo + 1
    while hi - lo < policy.max_batch_size:
        options = []
        for side, index in (("longer", hi), ("shorter", lo - 1)):
            if 0 <= index < len(by_length):
                lengths = [e.length for e in by_length[lo:hi]] + [by_length[index].length]
                if max(lengths) * len(lengths) > policy.max_batch_tokens:
                    continue
                if target_tokens is not None and \
                        abs(sum(lengths) - target_tokens) > abs(sum(lengths[:-1]) - target_tokens):
                    continue  # it takes the batch further from its target
                share = 0.0
                if flops is not None:
                    total, padding = flops(len(lengths), max(lengths), sum(lengths), sum(n * n for n in lengths))
                    share = padding / total
                if share <= policy.max_padding_fraction:
                    options.append((share, side))
        if not options:
            break
        if min(options)[1] == "longer":
            hi += 1
        else:
            lo -= 1
    return by_length[lo:hi]


CONFIGS = [BertConfig(vocab_size=100, hidden_size=width, num_hidden_layers=layers, num_attention_heads=2,
                      intermediate_size=4 * width) for width, layers in [(32, 1), (384, 6), (768, 12)]]


@pytest.mark.parametrize("seed", range(6))
def test_the_written_out_choice_is_the_plain_rule(seed):
    rng = random.Random(seed)
    batches = 0
    for _ in range(25):
        lengths = [rng.choice([rng.randint(3, 40), rng.randint(3, 300), 30]) for _ in range(rng.randint(1, 150))]
        ticket = Ticket(deadline=1e18, size=len(lengths), sink=None)
        queue = [Entry([1] * n, ticket, index) for index, n in enumerate(lengths)]
        policy = BatchPolicy(max_batch_tokens=rng.choice([512, 4096, 16384]), max_batch_size=rng.choice([8, 64, 128]),
                             max_padding_fraction=rng.choice([0.05, 0.1, 0.5, 1.0]))
        config = rng.choice(CONFIGS)
        flops = rng.choice([None, partial(packed_batch_flops, config),
                            partial(packed_batch_flops, config, attention_per_sequence=True)])
        target = rng.choice([None, None, rng.randint(20, 3000)])
        while queue:
            chosen = choose_batch(queue, policy, flops, target)
            assert [e.index for e in chosen] == [e.index for e in plainly_chosen(queue, policy, flops, target)]
            queue = [e for e in queue if all(e is not c for c in chosen)]
            batches += 1
    assert batches > 100  # many batches compared, not a few trivial ones
