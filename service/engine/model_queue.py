"""One model's queued entries, kept by length (each length's entries oldest first), so that taking a batch costs
about the batch, not the queue.

A batch is the oldest entry and its neighbours in length order (`batch_choice.choose_span`). Sorting the whole queue
for each batch and filtering the taken entries out of it grows with the queue: with batches of 256 (a GPU's), 0.85 µs
an input at 800 queued and 2.53 at 4,000 (near the default queue limit), where this costs 0.78 and 0.69
(bench.serving.batch_selection, BENCHMARKS.md) on the one interpreter that feeds the device, just when it is
busiest. Here the entries wait in one list per length; a batch reads only the lengths around its oldest entry's, up
to a batch's size either side, and deletes what it takes from the ends of those lists. (A queue shorter than a batch
costs more this way, 0.79 against 0.54 at 100 queued: then the device is not waiting on the host.)"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Iterator
from itertools import chain, count
from operator import attrgetter
from typing import TYPE_CHECKING

from service.engine.batch_choice import Flops, choose_span

if TYPE_CHECKING:
    from service.engine.batch_types import BatchPolicy
    from service.engine.tickets import Entry

_ARRIVAL = attrgetter("arrival")
_LENGTH = attrgetter("length")


class ModelQueue:
    def __init__(self) -> None:
        self._by_length: dict[int, list[Entry]] = {}  # each length's entries, in the order they came
        self._lengths: list[int] = []  # the lengths queued, ascending
        self._arrivals = count()
        self._count = 0
        self.tokens = 0  # of every entry queued

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[Entry]:
        return chain.from_iterable(self._by_length.values())

    def add(self, entries: list[Entry]) -> int:
        """Queue entries (in their order of arrival); returns their tokens."""
        by_length, arrivals = self._by_length, self._arrivals
        for entry in entries:
            entry.arrival = next(arrivals)
            bucket = by_length.get(entry.length)
            if bucket is None:
                bucket = by_length[entry.length] = []
                insort(self._lengths, entry.length)
            bucket.append(entry)
        tokens = sum(map(_LENGTH, entries))
        self._count += len(entries)
        self.tokens += tokens
        return tokens

    def oldest(self) -> Entry:
        """The entry that came first (each length's first is its oldest, so one look at each length)."""
        return min([bucket[0] for bucket in self._by_length.values()], key=_ARRIVAL)

    def take(self, policy: BatchPolicy, flops: Flops | None, target_tokens: int | None = None
             ) -> tuple[list[Entry], int]:
        """Take the next batch out of the queue (not empty): what `batch_choice.choose_batch` chooses from the same
        entries in arrival order, ascending by length; and its tokens."""
        oldest, reach = self.oldest(), policy.max_batch_size  # choose_span reaches no further from it, either side
        if self._count < 2 * reach:  # a short queue: all of it is the window, made and cleared in a few calls
            window = [*chain.from_iterable(map(self._by_length.__getitem__, self._lengths))]
            lo, hi = choose_span(window, window.index(oldest), policy, flops, target_tokens)
            if hi - lo == len(window):
                self._by_length.clear()
                self._lengths.clear()
            else:
                self._remove_span([(n, 0, len(self._by_length[n])) for n in self._lengths], lo, hi)
            return self._taken(window[lo:hi])
        at = bisect_left(self._lengths, oldest.length)
        # The window: (length, where its part starts in its list, how many) in ascending order; the oldest first
        # of its length, up to `reach` entries from it upwards and `reach - 1` below it (the shorter lengths' last).
        above: list[tuple[int, int, int]] = []
        have, top = 0, at
        while top < len(self._lengths) and have < reach:
            length = self._lengths[top]
            part = min(len(self._by_length[length]), reach - have)
            above.append((length, 0, part))
            have, top = have + part, top + 1
        below: list[tuple[int, int, int]] = []
        anchor, bottom = 0, at
        while bottom > 0 and anchor < reach - 1:
            bottom -= 1
            length = self._lengths[bottom]
            size = len(self._by_length[length])
            part = min(size, reach - 1 - anchor)
            below.append((length, size - part, part))
            anchor += part
        parts = [*reversed(below), *above]
        window = [*chain.from_iterable(self._by_length[n][first : first + part] for n, first, part in parts)]
        lo, hi = choose_span(window, anchor, policy, flops, target_tokens)
        self._remove_span(parts, lo, hi)
        return self._taken(window[lo:hi])

    def _taken(self, chosen: list[Entry]) -> tuple[list[Entry], int]:
        tokens = sum(map(_LENGTH, chosen))
        self._count -= len(chosen)
        self.tokens -= tokens
        return chosen, tokens

    def _remove_span(self, parts: list[tuple[int, int, int]], lo: int, hi: int) -> None:
        """Delete [lo:hi] of the window that `parts` make, one after another."""
        start = 0
        emptied = False
        for length, first, part in parts:
            begin, end = max(start, lo), min(start + part, hi)
            if begin < end:
                bucket = self._by_length[length]
                del bucket[first + begin - start : first + end - start]
                emptied = emptied or not bucket
            start += part
        if emptied:
            self._forget_emptied()

    def _forget_emptied(self) -> None:
        """Drop the lengths whose lists are empty."""
        for length in [n for n in self._lengths if not self._by_length[n]]:
            del self._by_length[length]
        self._lengths = [n for n in self._lengths if n in self._by_length]

    def remove_where(self, unwanted: Callable[[Entry], bool]) -> list[Entry]:
        """Take out every entry `unwanted` holds for; returns them in their order of arrival."""
        removed: list[Entry] = []
        for length in self._lengths:
            bucket = self._by_length[length]
            kept = []
            for entry in bucket:
                (removed if unwanted(entry) else kept).append(entry)
            if len(kept) != len(bucket):
                self._by_length[length] = kept
        if removed:
            self._forget_emptied()
            self._count -= len(removed)
            self.tokens -= sum(map(_LENGTH, removed))
            removed.sort(key=_ARRIVAL)
        return removed
