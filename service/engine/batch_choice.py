"""Which queued entries run together: the oldest, plus neighbours of similar length (the preparer's choice), and in
how many batches work that finds a runner idle is split (`even_split`).

A pure function of the queue and the policy, so that benchmarks and tests can call it as the preparer does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from service.engine.batch_types import BatchEngine, BatchPolicy
    from service.engine.tickets import Entry

Flops = Callable[[int, int, int, int], tuple[float, float]]
_LENGTH = attrgetter("length")


def pricing(engine: BatchEngine) -> Flops | None:
    """What `choose_batch` prices candidates with: the engine's FLOP model, or None where attention never pads."""
    return engine.flops if engine.pads_attention else None


def choose_batch(queue: Sequence[Entry], policy: BatchPolicy, flops: Flops | None, target_tokens: int | None = None
                 ) -> list[Entry]:
    """The oldest entry (queue[0]) plus neighbours in length order: `choose_span` over the whole queue sorted by length
    (a model's queue keeps that order as entries come and go: service.engine.model_queue)."""
    by_length = sorted(queue, key=_LENGTH)
    lo, hi = choose_span(by_length, by_length.index(queue[0]), policy, flops, target_tokens)
    return by_length[lo:hi]


def choose_span(by_length: Sequence[Entry], anchor: int, policy: BatchPolicy, flops: Flops | None,
                target_tokens: int | None = None) -> tuple[int, int]:
    """The batch around `by_length[anchor]` (the oldest entry; ties in length in arrival order) as the slice
    [lo:hi] of `by_length`: neighbours in length order join while the batch stays within the token budget, the
    sequence cap and the padding cap (none with `flops` None: see `pricing`), and, with `target_tokens` (of real
    input: a part of an `even_split`), while a neighbour brings the batch nearer it. It never reaches further than
    `policy.max_batch_size` entries either side, so a window of that many on each side chooses as the whole would.

    Batches run packed (no padding in the token-wise layers), so padding costs only attention work:
    the cap is on the share of the batch's FLOPs spent on it, which stays near zero for short inputs
    of any mix and grows when long and short inputs share a batch. Each step takes the side (shorter
    or longer neighbour) that wastes less. Entries left out go into the next batch.
    """
    lo, hi = anchor, anchor + 1  # chosen = by_length[lo:hi]
    longest = real = by_length[anchor].length
    squares = longest ** 2
    size, budget, cap = len(by_length), policy.max_batch_tokens, policy.max_padding_fraction
    if flops is None and target_tokens is None and cap >= 0:
        # Unpriced and untargeted every share is 0, so the longer side wins while it fits, and the lengths ascend:
        # when the last longer entry the size cap allows fits the budget with all before it, the loop below would
        # take every one of them, then shorter ones while the longest times their count fits. A GPU's batches of
        # 256 short inputs cost that loop ~50 µs each (the Xeon); this, a few operations.
        top = min(size, anchor + policy.max_batch_size)
        longest = by_length[top - 1].length
        if 0 < longest and longest * (top - anchor) <= budget:
            return max(0, top - min(policy.max_batch_size, budget // longest)), top
        longest = real
    # A neighbour of n tokens brings the batch nearer its target while real + n/2 <= target.
    twice_target = 2 * target_tokens if target_tokens is not None else None
    # The loop below runs up to a batch's size per batch on the preparer's thread, so it is written out: each side's
    # candidate is priced inline (one call where the model prices), and the sides compared as (share, side)
    # tuples would be, the longer side winning a tie (tests/service/engine/test_batch_choice.py holds it to that rule).
    # Unpriced (flops None) every share is 0: pricing costs ~10 µs per entry taken, most of a core at a GPU's
    # 80k sentences/s, and where attention never pads it could only say 0.
    while hi - lo < policy.max_batch_size:
        count = hi - lo + 1
        best_share = best_side = None
        if hi < size:  # the longer neighbour: it sets the new longest
            n = by_length[hi].length
            if n * count <= budget and (twice_target is None or 2 * real + n <= twice_target):
                share = 0.0
                if flops is not None:
                    total, padding = flops(count, n, real + n, squares + n * n)
                    share = padding / total
                if share <= cap:
                    best_share, best_side = share, hi
        if lo > 0:  # the shorter neighbour: the longest stays
            n = by_length[lo - 1].length
            if longest * count <= budget and (twice_target is None or 2 * real + n <= twice_target):
                share = 0.0
                if flops is not None:
                    total, padding = flops(count, longest, real + n, squares + n * n)
                    share = padding / total
                if share <= cap and (best_share is None or share < best_share):
                    best_share, best_side = share, lo - 1
        if best_side is None:
            break
        n = by_length[best_side].length
        if best_side == hi:
            hi += 1
            longest = n
        else:
            lo -= 1
        real += n
        squares += n * n
    return lo, hi


# An even split aims below the token budget by this much, so that a batch's padding (its longest input times its
# count, which the budget bounds) still fits when the share of real tokens does.
SPLIT_FILL = 0.9


def even_split(queued_tokens: int, queued_entries: int, policy: BatchPolicy, runners: int, busy: int) -> int | None:
    """How many batches the queue should go in so that it ends at about the same time on every runner, or None where
    no split helps (one runner: a GPU; or one batch for the one idle runner).

    On a CPU each runner computes its batch on its share of the cores, so a request alone on the device that fits
    one batch leaves the other runners idle (one client sending 8 sentences a request: an even split over two
    runners gave about 1.5x the sentences/s, BENCHMARKS.md), and three batches on two runners leave one of them
    computing the third alone. So the queue goes in as few batches as the budgets allow, rounded up until with the
    `busy` runners' batches they make whole rounds over every runner, of equal real tokens each."""
    if runners <= 1 or busy >= runners or queued_entries <= 1:
        return None
    batches = max(-(-queued_tokens // max(1, int(policy.max_batch_tokens * SPLIT_FILL))),
                  -(-queued_entries // policy.max_batch_size))
    batches += -(batches + busy) % runners
    batches = min(batches, queued_entries)
    return batches if batches > 1 else None


class SplitUnderWay:
    """An even split being taken from the queue: the batches and real tokens still to take. Each batch aims at an
    equal part of what is left, so one that came out short (a length's padding bound it) makes the rest larger, not
    one more batch."""

    def __init__(self, batches: int, tokens: int):
        self.batches, self.tokens = batches, tokens

    def target(self) -> int:
        return -(-self.tokens // self.batches)

    def took(self, tokens: int) -> bool:
        """Count a batch of `tokens` taken; whether the split has batches left."""
        self.batches -= 1
        self.tokens -= tokens
        return self.batches > 0 and self.tokens > 0
