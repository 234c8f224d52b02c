"""How many rows a packed bfloat16 batch is computed on, on a CPU: its token count rounded up to one of sixteen sizes a
doubling.

torch runs a bfloat16 matrix product on a CPU through oneDNN, which builds a set-up (a JIT-compiled kernel and its
plan) for each shape it meets and keeps it: up to 1,024 per computing thread (ideep's cache) and 1,024 more per
process, 0.3-0.6 MiB each. A packed batch has as many rows as it has real tokens, and few batches share a count, so
every batch adds set-ups: one thread computing batches of 8-2,400 tokens grew by 745 MiB in 400 batches, and building
them costs about what the products themselves cost on a small batch (2 ms for a MiniLM layer's four products at 64
rows). Rounded up to these sizes, a thread meets at most 16 row counts a doubling, whose set-ups stay cached
(BENCHMARKS.md, "Several models behind one server", has what the same thread then holds, and its speed).

The extra rows cost at most 1/16 of a batch's per-token work (about 1/48 on average; eight sizes a doubling, twice
that, cost a ColBERT rerank 6% of its time). They hold no token: attention gives
them zeros and reads nothing from them, every other layer works row by row, so a real token's result does not depend
on them (oneDNN gives each row the same bits at any row count: tests/model/test_row_buckets.py). float32 and float16
products keep no per-shape set-ups (measured: no growth), and the int8 path runs its own C kernels: neither rounds.
"""

from __future__ import annotations

import torch

SIZES_PER_DOUBLING_LOG2 = 4  # sixteen sizes a doubling: at most 1/16 of the rows are extra
SMALLEST_STEP = 8  # below 128 rows: multiples of 8, so a batch of a few short sentences pays at most 7 rows


def rounds_rows(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether batches computed in `dtype` on `device` are rounded up (bfloat16 on a CPU: see above)."""
    return device.type == "cpu" and dtype == torch.bfloat16


def rows_to_compute(tokens: int) -> int:
    """`tokens` rounded up to the next of sixteen sizes a doubling (multiples of 8 below 128 rows)."""
    if tokens <= 0:
        return tokens
    doubling = (tokens - 1).bit_length() - 1  # tokens lies in (2**doubling, 2**(doubling + 1)]
    step = max(SMALLEST_STEP, 1 << max(0, doubling - SIZES_PER_DOUBLING_LOG2))
    return -(-tokens // step) * step
