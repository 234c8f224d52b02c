"""What rounding a bfloat16 batch's rows up (model/row_buckets.py) does to a CPU thread's memory and speed: one
thread computes the same packed batches of all-MiniLM-L6-v2 in bfloat16, on their own row counts and on rounded ones,
each way in a process of its own (oneDNN's caches are per process and per thread), in turns.

    python -m bench.precision.row_buckets                  # batches of 1-40 sentences of 8-60 tokens
    python -m bench.precision.row_buckets --most-sentences 6   # small batches, where the extra rows weigh most
    python -m bench.precision.row_buckets --quick              # a smoke run (tests/bench)

Each run: the resident memory after loading and after every 100 batches, and the tokens/s of the batches after the
first 100 (by then both ways have built most of their set-ups). Batch sizes are drawn from a fixed seed, so both
ways compute the same batches.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time

import torch

from devkit.paths import minilm_dir

WARM_BATCHES = 100


def rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096 / 2**20


def one_way(rounded: bool, batches: int, most_sentences: int) -> dict:
    """Runs in its own process: the figures of one way."""
    import kernels
    from model import load_checkpoint
    from model.fuse import fuse_attention_projections
    from model.packing import Packing
    from model.row_buckets import rows_to_compute

    torch.set_num_threads(1)
    kernels.install()
    model = fuse_attention_projections(load_checkpoint(minilm_dir()).model).to(torch.bfloat16).eval()
    draw = random.Random(0)
    memory = [rss_mib()]
    tokens, started = 0, time.perf_counter()
    with torch.inference_mode():
        for index in range(batches):
            lengths = [draw.randint(8, 60) for _ in range(draw.randint(1, most_sentences))]
            count = sum(lengths)
            ids = torch.randint(1000, 20000, (count,), generator=torch.Generator().manual_seed(index))
            spare = rows_to_compute(count) - count if rounded else 0
            model.encode_packed(ids, torch.zeros_like(ids), Packing.from_lengths(lengths, spare_rows=spare), False)
            if index + 1 == WARM_BATCHES:
                tokens, started = 0, time.perf_counter()
            else:
                tokens += count
            if (index + 1) % 100 == 0:
                memory.append(rss_mib())
    return {"rss_mib": memory, "tokens_per_s": tokens / (time.perf_counter() - started)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=400)
    parser.add_argument("--most-sentences", type=int, default=40, help="a batch has 1 to this many sentences")
    parser.add_argument("--turns", type=int, default=2, help="runs of each way, in turns")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 110 small batches, one turn (tests/bench)")
    parser.add_argument("--one-way", choices=["exact", "rounded"], help=argparse.SUPPRESS)  # a child's run
    args = parser.parse_args()
    if args.quick:
        args.batches, args.most_sentences, args.turns = WARM_BATCHES + 10, 3, 1
    if args.batches <= WARM_BATCHES:
        parser.error(f"--batches must be above {WARM_BATCHES} (the first {WARM_BATCHES} warm up)")
    if args.one_way:
        print(json.dumps(one_way(args.one_way == "rounded", args.batches, args.most_sentences)))
        return
    if not torch.backends.mkldnn.is_available():
        raise SystemExit("this torch has no oneDNN: bfloat16 products keep no per-shape set-ups to measure")
    print(f"{args.batches} batches of 1-{args.most_sentences} sentences of 8-60 tokens, one thread, bfloat16")
    for turn in range(args.turns):
        for way in ("exact", "rounded"):
            child = subprocess.run([sys.executable, "-m", "bench.precision.row_buckets", "--one-way", way,
                                    "--batches", str(args.batches), "--most-sentences", str(args.most_sentences)],
                                   capture_output=True, text=True, check=True)
            found = json.loads(child.stdout.splitlines()[-1])
            memory = found["rss_mib"]
            print(f"turn {turn + 1}, {way:7s}: {found['tokens_per_s']:6.0f} tokens/s after the first "
                  f"{WARM_BATCHES}; resident MiB after loading {memory[0]:.0f}, every 100 batches "
                  + " ".join(f"{m:.0f}" for m in memory[1:]) + f" (+{memory[-1] - memory[0]:.0f})", flush=True)


if __name__ == "__main__":
    main()
