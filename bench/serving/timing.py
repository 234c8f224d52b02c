"""Timing a call in process, for the benchmarks that time one function at a time (serving's encoding, peak's attention,
rerank's int8 budget)."""

from __future__ import annotations

import time
from collections.abc import Callable


def best_ms(function: Callable[[], object], repeats: int = 20, warm_ups: int = 0) -> float:
    """The fastest of `repeats` calls, in milliseconds, after `warm_ups` untimed ones (first-call costs: a kernel's
    build and check, caches)."""
    for _ in range(warm_ups):
        function()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return min(times) * 1000
