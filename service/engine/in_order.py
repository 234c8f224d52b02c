"""A list of items through the batcher, answered in order: how a job without clients (the corpus job) runs its stream
of batches through the same batcher as the service's requests.

The items go in as tickets of one batch's size, in the order given (a caller that sorts by length gets batches of
like lengths: the batcher's choice takes the oldest entry's neighbours by length), at most `window` tickets in the
batcher at once so that the queue stays short and memory bounded; as each ticket comes back the next goes in. The
batcher then does for the job what it does for requests: picks and collates the next batch while the device computes
this one, runs one batch per runner (on a CPU each on its share of the cores; on a GPU the next launched before the
last is read), and splits a batch that runs out of device memory.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable

from service.engine.batcher import Batcher
from service.engine.tickets import Ticket
from service.errors import ServiceError

# A job's inputs have no client waiting with a deadline, but the batcher's clock needs a finite one (its waits
# take a timeout): a day and a half, never reached by a queue kept `window` tickets short.
NO_DEADLINE_S = 1e5


class ItemsFailed(RuntimeError):
    """A batch of the job's items failed on the device (ServiceError's kind and message in the text)."""


class _Returned:
    """The batcher's Sink for one call: finished tickets wait here for the calling thread."""

    def __init__(self):
        self.tickets: queue.SimpleQueue[Ticket] = queue.SimpleQueue()

    def deliver(self, tickets: list[Ticket]) -> None:
        for ticket in tickets:
            self.tickets.put(ticket)


def window_for(batcher: Batcher) -> int:
    """Tickets in the batcher at once: enough that every runner has a batch computing and one prepared ahead,
    with a batch's worth to choose from, and no more (the batcher sorts its queue at each choice)."""
    return 2 * batcher.policy.runners + 2


def compute_in_order(batcher: Batcher, items: list, window: int | None = None,
                     on_returned: Callable[[list], None] | None = None) -> list:
    """Every item's result, in the items' order. `on_returned` hears each finished ticket's items (progress).
    Raises ItemsFailed at the first failed batch, after taking the job's other tickets out of the batcher."""
    group = batcher.policy.max_batch_size
    window = window or window_for(batcher)
    results: list = [None] * len(items)
    returned = _Returned()
    waiting: dict[int, Ticket] = {}  # by the index of the ticket's first item
    starts = iter(range(0, len(items), group))
    while True:
        while len(waiting) < window and (start := next(starts, None)) is not None:
            chunk = items[start:start + group]
            ticket = Ticket(time.monotonic() + NO_DEADLINE_S, len(chunk), returned, tag=start)
            batcher.submit(chunk, ticket)
            waiting[start] = ticket
        if not waiting:
            return results
        ticket = returned.tickets.get()
        waiting.pop(ticket.tag)
        if ticket.error is not None:
            for other in waiting.values():
                batcher.cancel(other)
            raise ItemsFailed(_describe(ticket.error))
        results[ticket.tag:ticket.tag + ticket.size] = ticket.results
        if on_returned is not None:
            on_returned(items[ticket.tag:ticket.tag + ticket.size])


def _describe(error: ServiceError) -> str:
    return f"{error.kind}: {error.message}"
