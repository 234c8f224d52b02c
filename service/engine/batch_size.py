"""How many tokens a batch should hold on this CPU, measured at start-up.

On a GPU, bigger batches are faster per sequence until memory runs out. On a CPU they are only up to a
point: past it a batch's activations no longer fit the caches, and its elementwise work (GELU,
LayerNorm, softmax) waits on memory. Measured in-process on this project's 2-core machine (BENCHMARKS.md),
the bundled model served most sequences per second at batches of 16 x 33 tokens and 30% fewer at 128.
Where that point lies depends on the model's width and on the CPU. The default (`cpu_batch_tokens`) comes
from measurement; with `--cpu-batch-tokens 0` it is measured at start-up instead: batches of 32-token
inputs at several token counts, timed with the threads one compute runner has, and the largest batch
within `tolerance` of the best time per token wins.
"""

from __future__ import annotations

import logging
import time

from service.tasks import EncodeItem

log = logging.getLogger("service")
SIZES = (256, 512, 1024, 2048, 4096)  # tokens per batch tried
INPUT_TOKENS = 32  # a typical sentence


def measure_batch_tokens(engine, token_id: int, cls_id: int, sep_id: int, ceiling: int, tolerance: float = 0.10,
                         repeats: int = 2) -> int:
    """The largest tried token count per batch whose time per token is within `tolerance` of the best."""
    seconds_per_token: dict[int, float] = {}
    for size in (s for s in SIZES if s <= ceiling):
        items = [EncodeItem([cls_id] + [token_id] * (INPUT_TOKENS - 2) + [sep_id], [0] * INPUT_TOKENS, pooling="mean")
                 for _ in range(size // INPUT_TOKENS)]
        batch = engine.collate(items)
        engine.run(batch)  # first call of this shape
        best = float("inf")
        for _ in range(repeats):
            started = time.perf_counter()
            engine.run(batch)
            best = min(best, time.perf_counter() - started)
        seconds_per_token[size] = best / size
    if not seconds_per_token:
        return ceiling
    fastest = min(seconds_per_token.values())
    chosen = max(size for size, t in seconds_per_token.items() if t <= fastest * (1 + tolerance))
    log.info("batch size on this CPU: %d tokens per batch (microseconds per token by batch tokens: %s)", chosen,
             ", ".join(f"{size}: {t * 1e6:.0f}" for size, t in seconds_per_token.items()))
    return chosen
