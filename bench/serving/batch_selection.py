"""The preparer's host work per input, alone on one thread: queueing a request's inputs, choosing each batch, and
collating it, at the queue depths a GPU sees: 100 (light load), 800 (256 clients x 8 over the stand-in device,
bench.serving.engine_pipeline) and 4,000 (overload, near the default queue limit of 4,096).

On a GPU this work runs on the one interpreter that feeds the device, so each microsecond an input is ~1% of what
the engine lets through at 100k sentences/s. Two ways of keeping the queue, in the same run: by length
(service.engine.model_queue, what the batcher keeps) and in arrival order, sorted by length for each batch and
filtered after it (`batch_choice.choose_batch` over a deque: how the batcher kept it before). Items are read off
the wire as the engine reads them (int32 views of a Submit's buffer). `--base DIR` also collates in another checkout
(its own engine code), for a change to collation measured against the code before it.

    python -m bench.serving.batch_selection [--checkpoint DIR] [--base DIR] [--rounds 3] [--depths 100 800 4000]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from itertools import filterfalse
from pathlib import Path

import torch

HERE = Path(__file__).resolve()


def _checkpoint_and_requests(checkpoint_dir: Path) -> tuple[object, list[list]]:
    from bench.serving.throughput import sentences
    from model import load_checkpoint
    from service.messages import Submit, decode, encode
    from service.tasks import EncodeItem

    checkpoint = load_checkpoint(checkpoint_dir)
    encoded = checkpoint.tokenizer.encode_batch(sentences(2000, None, None))
    items = [EncodeItem(list(e.ids), list(e.type_ids), "mean", True) for e in encoded]
    # read off the wire as the engine reads a front end's Submit: 8 inputs a request
    return checkpoint, [decode(encode(Submit(0, items[i : i + 8], 1e18))).items for i in range(0, len(items) - 7, 8)]


def _arrivals(requests: list[list], seed: int) -> Iterator[list]:
    """Endless requests' entries, as the batcher makes them on submission."""
    from service.engine.tickets import Entry, Ticket

    rng = random.Random(seed)
    while True:
        ticket = Ticket(float("inf"), 8, None)
        yield [Entry(item, ticket, index, 0.0) for index, item in enumerate(rng.choice(requests))]


def _by_length(policy, flops) -> tuple[Callable, Callable, Callable]:
    from service.engine.model_queue import ModelQueue

    queue = ModelQueue()
    return queue.add, lambda: queue.take(policy, flops)[0], queue.__len__


def _sorted_each_batch(policy, flops) -> tuple[Callable, Callable, Callable]:
    from service.engine.batch_choice import choose_batch

    queue: deque = deque()

    def take() -> list:
        nonlocal queue
        chosen = choose_batch(queue, policy, flops)
        taken = set(chosen)
        queue = deque(filterfalse(taken.__contains__, queue))
        return chosen

    return lambda entries: queue.extend(entries), take, lambda: len(queue)  # the queue, as `take` leaves it


def queue_us(requests: list[list], kept: Callable, depth: int, policy, flops, rounds: int, batches: int = 200) -> float:
    """CPU µs an input to queue it and choose its batch, the queue refilled to `depth` after each batch (best of
    `rounds`)."""
    best = float("inf")
    for round_ in range(rounds):
        arrivals = _arrivals(requests, round_)
        add, take, size = kept(policy, flops)
        while size() < depth:
            add(next(arrivals))
        taken, started = 0, time.process_time()
        for _ in range(batches):
            taken += len(take())
            while size() < depth:
                add(next(arrivals))
        best = min(best, 1e6 * (time.process_time() - started) / taken)
    return best


def collate_us(checkpoint, requests: list[list], size: int, rounds: int, batches: int = 200) -> float:
    """CPU µs an input to collate batches of `size` (best of `rounds`), with the engine the service builds."""
    from service.engine.loader import build_engine
    from service.engine.precision import choose

    cpu = torch.device("cpu")
    engine = build_engine(checkpoint, cpu, choose("float32", cpu))
    rng = random.Random(0)
    inputs = [item for request in requests for item in request]
    groups = [rng.sample(inputs, size) for _ in range(batches)]
    best = float("inf")
    for _ in range(rounds):
        started = time.process_time()
        for group in groups:
            engine.collate(group)
        best = min(best, 1e6 * (time.process_time() - started) / (size * batches))
    return best


def main(argv: list[str] | None = None) -> int:
    from bench.serving.rows import parts_table
    from devkit.paths import checkpoint_argument
    from service.settings import DEFAULT_CHECKPOINT

    parser = argparse.ArgumentParser(prog="python -m bench.serving.batch_selection", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=checkpoint_argument, default=DEFAULT_CHECKPOINT)
    parser.add_argument("--base", type=Path, default=None, help="another checkout: its collation, in the same run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--depths", type=int, nargs="+", default=[100, 800, 4000])
    parser.add_argument("--collate-only", action="store_true", help=argparse.SUPPRESS)  # what --base runs
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    checkpoint, requests = _checkpoint_and_requests(args.checkpoint)
    if args.collate_only:
        print(json.dumps({size: collate_us(checkpoint, requests, size, args.rounds) for size in (64, 256)}))
        return 0

    from service.engine.batch_choice import pricing
    from service.engine.batcher import BatchPolicy
    from service.engine.loader import build_engine
    from service.engine.precision import choose

    cpu = torch.device("cpu")
    priced = pricing(build_engine(checkpoint, cpu, choose("float32", cpu)))
    rows: dict[str, float] = {}
    for size, flops, how in ((256, None, "unpriced (a GPU in bfloat16)"), (64, priced, "priced (a CPU)")):
        policy = BatchPolicy(max_batch_tokens=16384, max_batch_size=size, max_padding_fraction=0.10)
        for depth in args.depths:
            for name, kept in (("kept by length", _by_length), ("sorted for each batch", _sorted_each_batch)):
                rows[f"batches of {size} {how}, {depth:,} queued: queue + choose, {name}"] = \
                    queue_us(requests, kept, depth, policy, flops, args.rounds)
        rows[f"batches of {size}: collate"] = collate_us(checkpoint, requests, size, args.rounds)
    if args.base is not None:
        found = subprocess.run([sys.executable, str(HERE), "--collate-only", "--rounds", str(args.rounds),
                                "--checkpoint", str(args.checkpoint)], cwd=args.base, capture_output=True, text=True,
                               env={**os.environ, "PYTHONPATH": str(args.base.resolve())}, check=False)
        if found.returncode != 0:
            print(f"error: the base checkout {args.base} could not collate:\n{found.stderr[-2000:]}", file=sys.stderr)
            return 1
        for size, value in json.loads(found.stdout.strip().splitlines()[-1]).items():
            rows[f"batches of {size}: collate, the base checkout"] = value
    print(f"\n{platform.processor() or platform.machine()}, {os.cpu_count()} cores, one thread, CPU time "
          f"(time.process_time), best of {args.rounds}; {args.checkpoint.name}, inputs off the wire, 8 a request\n")
    parts_table(rows, "CPU µs an input", 3, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
