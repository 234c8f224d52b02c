"""How many tokens a batch should hold on a CPU: sized from the model's width, or measured at start-up.

On a GPU, bigger batches are faster per sequence until memory runs out. On a CPU they are only up to a
point: past it a batch's activations no longer fit the caches, and its elementwise work (GELU,
LayerNorm, softmax) waits on memory. Below it, each batch's fixed cost (a hundred-odd operator calls, the
packing, the results) is spread over too few sequences. Where that point lies depends on the model's width.
Timed in-process on this project's 2-core machine with one thread and 32-token inputs (`python -m
bench.serving.cpu_batch_tokens`; figures in BENCHMARKS.md), models with feed-forward widths 1,024 / 1,536 /
3,072 / 4,096 ran fastest per token at 512-1,024 tokens a batch and 5-20% slower at 4,096, while a 64-wide one
kept getting faster up to 4,096 (its fixed cost dominates). So by default (`cpu_batch_tokens` auto) the budget
is the largest power of two of tokens whose widest activation, the feed-forward's (tokens x intermediate
size), fits ACTIVATION_BYTES: 1,024 for all-MiniLM-L6-v2, 512 for BERT-base, the whole max_batch_tokens for a
toy model. With `--cpu-batch-tokens measure` it is timed at start-up instead: batches of 32-token inputs at
several token counts, with the threads one compute runner has, and the largest batch within `tolerance` of
the best time per token wins (on a flat curve, as real models have, that choice is at the mercy of noise).
"""

from __future__ import annotations

import logging
import time

from service.tasks import EncodeItem

log = logging.getLogger("service")
SIZES = (256, 512, 1024, 2048, 4096)  # tokens per batch tried
INPUT_TOKENS = 32  # a typical sentence
ACTIVATION_BYTES = 6 << 20  # a few L2s' worth; the sweep's best for every width it tried (module docstring)
SMALLEST_BUDGET = 256  # the smallest size the sweep tried: what a model wider than any it tried gets


def batch_tokens_for_width(intermediate_size: int, element_bytes: int, ceiling: int) -> int:
    """The largest power of two of tokens whose feed-forward activation fits ACTIVATION_BYTES, kept within
    [SMALLEST_BUDGET, ceiling]."""
    fitting = ACTIVATION_BYTES // max(1, intermediate_size * element_bytes)
    power = 1 << max(0, fitting.bit_length() - 1)
    return max(min(SMALLEST_BUDGET, ceiling), min(power, ceiling))


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
