"""Which queued entries run together: the oldest, plus neighbours of similar length (the packer's choice).

A pure function of the queue and the policy, so that benchmarks and tests can call it as the packer does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from service.engine.batcher import BatchEngine, BatchPolicy, Entry

Flops = Callable[[int, int, int, int], tuple[float, float]]
_LENGTH = attrgetter("length")


def pricing(engine: BatchEngine) -> Flops | None:
    """What `choose_batch` prices candidates with: the engine's FLOP model, or None where attention never pads."""
    return engine.flops if engine.pads_attention else None


def choose_batch(queue: Sequence[Entry], policy: BatchPolicy, flops: Flops | None) -> list[Entry]:
    """The oldest entry (queue[0]) plus neighbours in length order, while the batch stays within the
    token budget, the sequence cap and the padding cap (none with `flops` None: see `pricing`).

    Batches run packed (no padding in the token-wise layers), so padding costs only attention work:
    the cap is on the share of the batch's FLOPs spent on it, which stays near zero for short inputs
    of any mix and grows when long and short inputs share a batch. Each step takes the side (shorter
    or longer neighbour) that wastes less. Entries left out go into the next batch.
    """
    by_length = sorted(queue, key=_LENGTH)
    anchor = by_length.index(queue[0])
    lo, hi = anchor, anchor + 1  # chosen = by_length[lo:hi]
    longest = real = by_length[anchor].length
    squares = longest ** 2

    def waste(new_longest: int, new_real: int, new_squares: int, count: int) -> float | None:
        """Padding share of the batch's compute, or None when it breaks the token budget or the cap."""
        if new_longest * count > policy.max_batch_tokens:
            return None
        if flops is None:  # pricing costs ~10 µs per entry taken: most of a core at a GPU's 80k sentences/s
            return 0.0
        total, padding = flops(count, new_longest, new_real, new_squares)
        share = padding / total
        return share if share <= policy.max_padding_fraction else None

    while hi - lo < policy.max_batch_size:
        count = hi - lo + 1
        options = []
        for side, index in (("shorter", lo - 1), ("longer", hi)):
            if 0 <= index < len(by_length):
                n = by_length[index].length
                share = waste(max(longest, n), real + n, squares + n * n, count)
                if share is not None:
                    options.append((share, side, n))
        if not options:
            break
        _, side, n = min(options)
        lo, hi = (lo - 1, hi) if side == "shorter" else (lo, hi + 1)
        longest = max(longest, n)
        real += n
        squares += n * n
    return by_length[lo:hi]
