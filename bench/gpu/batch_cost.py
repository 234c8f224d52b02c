"""The host's cost of the training batches, per token: can the input pipeline feed the GPU recipe's rate?

Builds steps' batches as the trainer's worker processes do (trainer.data.batches.training_batch: pairs, collation, masks,
fixed shapes for CUDA graphs) from a prepared corpus with the GPU recipe's sizes, on one core, and prints the seconds
of each part and the tokens/s one worker (and n workers: each builds one step in n, and moves the data cursors past
the others' steps with TrainingPairs.advance) can build.

    python -m bench.gpu.batch_cost --corpus .data/gpu-corpus/wikipedia [--stream-workers 2]

`--stream-workers N` also times the trainer's own stream (trainer.data.batches.BatchStream) with N worker
processes, fixed shapes, as the GPU recipe runs it: what the model above predicts, measured.
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
import time
from pathlib import Path

import torch

from bench.gpu.train_bundled import CORPUS, WARM_START


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu.batch_cost", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--max-seq-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--stream-workers", type=int, default=0, help="also time BatchStream with this many workers")
    parser.add_argument("--stream-steps", type=int, default=40)
    args = parser.parse_args(argv)

    from trainer.data.pipeline import prepare
    from trainer.data.examples import TrainingPairs, collate
    from trainer.data.masking import in_slots, mask_tokens, replaceable_ids, slots_per_row
    from trainer.options import TrainOptions
    from trainer.state import Progress

    torch.set_num_threads(1)  # a worker process's share
    with tempfile.TemporaryDirectory() as scratch:
        options = TrainOptions(corpus=[str(args.corpus)], output=Path(scratch) / "unused", init_from=WARM_START,
                               batch_size=args.batch_size, max_seq_len=args.max_seq_len, mask_rate=0.2,
                               progress=False, cache_dir=Path(scratch))
        data = prepare(options)
    pairs = TrainingPairs(data.train, options.max_seq_len, options.seed, options.short_seq_prob, data.weights)
    replace = replaceable_ids(data.tokenizer, data.tokenizer.vocab_size)
    progress = Progress(cursors=pairs.initial_cursors())
    parts = {"pairs": 0.0, "collate": 0.0, "masks": 0.0, "fixed_shapes": 0.0}
    tokens, advance_s = 0, 0.0
    for step in range(args.steps + 1):  # the first is a warm-up
        cursors = copy.deepcopy(progress.cursors)
        a0 = time.perf_counter()
        pairs.advance(step, options.batch_size, copy.deepcopy(cursors))
        advanced = time.perf_counter() - a0
        t0 = time.perf_counter()
        chosen = pairs.batch(step, options.batch_size, cursors)
        t1 = time.perf_counter()
        batch = collate(chosen, data.tokenizer)
        t2 = time.perf_counter()
        generator = torch.Generator().manual_seed(step)
        masked = mask_tokens(batch.input_ids, batch.special_mask, generator, data.tokenizer.mask_id, replace, 0.2)
        t3 = time.perf_counter()
        batch.padded_to(options.max_seq_len, data.tokenizer.pad_id)
        in_slots(masked.padded_to(options.max_seq_len, data.tokenizer.pad_id),
                 slots_per_row(options.max_seq_len, 0.2))
        t4 = time.perf_counter()
        progress.cursors = cursors
        if step:
            for name, seconds in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                parts[name] += seconds
            tokens += batch.num_real_tokens
            advance_s += advanced
    per_step = {name: round(seconds / args.steps * 1000, 1) for name, seconds in parts.items()}
    step_s, advance_s = sum(parts.values()) / args.steps, advance_s / args.steps
    tokens_per_step = tokens / args.steps
    report = {"batch": args.batch_size, "max_seq_len": args.max_seq_len, "real_tokens_per_step": round(tokens_per_step),
              "ms_per_step": per_step, "ms_to_advance_past_a_step": round(advance_s * 1000, 2),
              "us_per_token": round(step_s / tokens_per_step * 1e6, 3),
              # n workers: each builds one step in n and advances the cursors past the other n - 1
              "tokens_per_s_by_workers": {n: round(n * tokens_per_step / (step_s + (n - 1) * advance_s))
                                          for n in (1, 2, 3, 4)}}
    if args.stream_workers:
        report["stream"] = stream_rate(pairs, options, data, replace, args.stream_workers, args.stream_steps)
    print(json.dumps(report, indent=1))
    return 0


def stream_rate(pairs, options, data, replace, workers: int, steps: int) -> dict:
    """Real tokens/s of the trainer's batch stream with `workers` processes, once each has handed over a step."""
    from trainer.data.batches import BatchStream

    stream = BatchStream(pairs, 0, pairs.initial_cursors(), options, data, replace, ahead=True, fixed_shapes=True,
                         workers=workers)
    try:
        for step in range(workers):  # the processes' start-up
            stream.next(step)
        started, tokens = time.perf_counter(), 0
        for step in range(workers, workers + steps):
            tokens += stream.next(step).batch.num_real_tokens
        seconds = time.perf_counter() - started
    finally:
        stream.close()
    return {"workers": workers, "steps": steps, "tokens_per_s": round(tokens / seconds)}


if __name__ == "__main__":
    raise SystemExit(main())
