"""The in-process limit the serving rows are compared with: the engine alone on pre-tokenized batches of similar
lengths, at every batch size and arrangement (no HTTP, no queue); the best is the limit."""

from __future__ import annotations

import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from bench.serving.rows import Row

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)


def measure_limit(checkpoint: Path, texts: list[str], duration: float, batch_sizes=None, dtype: str = "auto"
                  ) -> tuple[Row, tuple[int, int], float, dict[tuple[int, int], float]]:
    """The engine alone on pre-tokenized batches of similar lengths: no HTTP, no queue.

    Every arrangement runs whole passes over all the inputs, visiting the batches in a shuffled
    order, so it computes the same mix of lengths as the HTTP rows (stopping part-way through a
    length-sorted pass would count only the short inputs). Tried: one batch at a time on all the
    cores, and, on CPU, one batch per core in parallel (as the service runs); each at batch sizes
    1 to 128. The best is the limit; the whole sweep (sequences/s by (batch size, batches in
    parallel)) comes back too, since best / batch 1 bounds what batching can gain on this device.
    """
    from model import load_checkpoint
    from model.device import keep_freed_memory, pick_device
    from service.engine.precision import choose
    from service.engine.loader import build_engine, capture_graphs
    from service.settings import Settings
    from service.tasks import EncodeItem

    ckpt = load_checkpoint(checkpoint)
    device = pick_device("auto")
    if device.type == "cpu":
        keep_freed_memory()  # as the service does by default (cpu_keep_freed_memory)
    engine = build_engine(ckpt, device, choose(dtype, device))
    batch_sizes = batch_sizes or BATCH_SIZES
    # As the service runs it: CUDA graphs where they run (one batch at a time; its default token budget)
    graphs = capture_graphs(engine, Settings().max_batch_tokens, max(batch_sizes), runners=1)
    print(f"# limit's engine: {engine.device}, {engine.dtype}, CUDA graphs: {graphs or 'off'}", flush=True)
    encoded = ckpt.tokenizer.encode_batch(texts, truncate=True)
    items = sorted((EncodeItem(e.ids, e.type_ids, pooling="mean") for e in encoded), key=len)
    # One forward pass of one input (the floor for latency at concurrency 1), over inputs of every length.
    singles = []
    for item in items[:: max(1, len(items) // 100)]:
        batch = engine.collate([item])
        started = time.perf_counter()
        engine.run(batch)
        singles.append(time.perf_counter() - started)
    single_ms = float(np.median(singles)) * 1000
    cores = torch.get_num_threads()
    arrangements = [1] + ([cores] if device.type == "cpu" and cores > 1 else [])  # batches in parallel
    best = best_arrangement = None
    sweep: dict[tuple[int, int], float] = {}
    for parallel in arrangements:
        torch.set_num_threads(max(1, cores // parallel))
        for batch_size in batch_sizes:
            batches = [engine.collate(items[i : i + batch_size]) for i in range(0, len(items), batch_size)]
            random.Random(0).shuffle(batches)
            engine.run(batches[0])  # warm-up
            seconds, passes = _whole_passes(engine, batches, parallel, duration / (len(batch_sizes) * len(arrangements)))
            costs = [(b.flops, b.padding_flops) for b in batches]
            done_sequences, done_tokens = passes * len(items), passes * sum(b.real_tokens for b in batches)
            row = Row("limit (in-process)", 0, done_sequences, seconds, done_sequences / seconds,
                      done_sequences / seconds, done_tokens / seconds, 0, 0, 0, mean_batch=batch_size,
                      padding=sum(w for _, w in costs) / sum(f for f, _ in costs),
                      batch_ms=1000 * seconds * parallel / (passes * len(batches)))  # wall-clock a batch
            sweep[batch_size, parallel] = row.sequences_per_s
            print(f"  limit {arrangement_label(batch_size, parallel):28s} {row.sequences_per_s:8.1f} seq/s",
                  file=sys.stderr)
            if best is None or row.sequences_per_s > best.sequences_per_s:
                best, best_arrangement = row, (batch_size, parallel)
    torch.set_num_threads(cores)
    if graphs:  # what the graphs gain in-process, batch size by batch size: the same batches run eagerly
        engine.use_graphs(None)
        eager = {}
        for batch_size in batch_sizes:
            batches = [engine.collate(items[i : i + batch_size]) for i in range(0, len(items), batch_size)]
            engine.run(batches[0])
            seconds, passes = _whole_passes(engine, batches, 1, duration / len(batch_sizes))
            eager[batch_size] = passes * len(items) / seconds
        print("# in-process without CUDA graphs, sequences/s by batch size: " + ", ".join(
            f"batch {size} {rate:.0f} (graphs {sweep[size, 1] / rate:.2f}x)" for size, rate in eager.items()))
    return best, best_arrangement, single_ms, sweep


def arrangement_label(batch_size: int, parallel: int) -> str:
    return f"batch {batch_size}" + (f" x {parallel} in parallel" if parallel > 1 else "")



def _whole_passes(engine, batches: list, parallel: int, budget_s: float) -> tuple[float, int]:
    """Run complete passes over `batches` (each split among `parallel` threads) until `budget_s` has
    passed; returns (seconds, passes), at least one pass."""
    def run_share(share):
        if not engine.overlaps:
            for batch in share:
                engine.run(batch)
            return
        in_flight = None  # as the service's runner does on a GPU: the next batch launched before the last is read
        for batch in share:
            launched = engine.launch(batch)
            if in_flight is not None:
                engine.finish(in_flight)
            in_flight = launched
        if in_flight is not None:
            engine.finish(in_flight)

    passes = 0
    started = time.perf_counter()
    while passes == 0 or time.perf_counter() - started < budget_s:
        if parallel == 1:
            run_share(batches)
        else:
            with ThreadPoolExecutor(parallel) as pool:
                list(pool.map(run_share, [batches[k::parallel] for k in range(parallel)]))
        passes += 1
    return time.perf_counter() - started, passes
