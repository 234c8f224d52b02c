"""Inputs longer than the model's window, put back together: the front end sends each window as a `WindowItem`
(batched with everything else, pooled alone by the encode head, not normalised), and when the request is finished
the engine folds the windows of each input into one vector before it answers, so a request gets one result per
input whatever its lengths.

The fold is the windows' pooled vectors averaged with each window's token count as its weight (special tokens
included, as the mean pooling counts them), then normalised if the input asked. For mean pooling that is the mean
over every token the windows hold, tokens in an overlap counted once per window: as vLLM's chunked processing pools.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from service.tasks import Item, PooledVector, WindowItem


def folder(items: list[Item]) -> Callable[[list], list] | None:
    """What turns the results of `items` into the request's, one per input; None when no item is a window."""
    if not any(isinstance(item, WindowItem) for item in items):
        return None
    return lambda results: fold_windows(items, results)


def fold_windows(items: list[Item], results: list) -> list:
    """Each run of windows of one input -> its PooledVector; every other item's result as it is."""
    folded, at = [], 0
    while at < len(items):
        item = items[at]
        if not isinstance(item, WindowItem):
            folded.append(results[at])
            at += 1
            continue
        stop = at + 1
        while stop < len(items) and isinstance(items[stop], WindowItem) and items[stop].source == item.source:
            stop += 1
        weights = np.array([len(w) for w in items[at:stop]], dtype=np.float64)
        vectors = np.stack([r.vector for r in results[at:stop]]).astype(np.float64)  # (windows, H)
        vector = (weights @ vectors) / weights.sum()
        if item.normalize_input:
            vector = vector / max(float(np.linalg.norm(vector)), 1e-12)
        folded.append(PooledVector(vector.astype(np.float32)))
        at = stop
    return folded
