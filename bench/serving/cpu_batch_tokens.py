"""Time per token by batch size on a CPU, for encoders of several widths: what `--cpu-batch-tokens auto` rests on.

Random-weight encoders (the shapes below) run batches of 32-token inputs through the service's engine, one thread
(as each of the two compute threads of a 2-core host has), in-process; the best of several timings per size.
The widest activation of a batch is the feed-forward's (tokens x intermediate size); `auto` takes the largest
power of two of tokens whose activation fits 6 MiB (service/engine/batch_size.py), printed as "auto" per row.

    python -m bench.serving.cpu_batch_tokens                 # every shape, about two minutes on 2 cores
    python -m bench.serving.cpu_batch_tokens --shapes toy minilm
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import torch

from model import BertConfig, BertForPreTraining
from model.fuse import fuse_attention_projections
from service.engine.batch_size import batch_tokens_for_width
from service.engine.engine import Engine
from service.tasks import EncodeItem

# name: (hidden, layers, heads, intermediate); fewer layers than the real models where only the shape matters
SHAPES = {"toy": (32, 1, 2, 64), "narrow": (256, 4, 4, 1024), "minilm": (384, 6, 12, 1536),
          "base": (768, 2, 12, 3072), "large": (1024, 1, 16, 4096)}
SIZES = (256, 512, 1024, 2048, 4096)
INPUT_TOKENS = 32


def seconds_per_token(engine: Engine, tokens: int) -> float:
    items = [EncodeItem([101] + [1996] * (INPUT_TOKENS - 2) + [102], [0] * INPUT_TOKENS, pooling="mean")
             for _ in range(tokens // INPUT_TOKENS)]
    engine.run(engine.collate(items))  # first call of this shape
    best = float("inf")
    for _ in range(max(3, 8192 // tokens)):
        started = time.perf_counter()
        engine.run(engine.collate(items))
        best = min(best, time.perf_counter() - started)
    return best / tokens


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, one thread; µs per token "
          "(× the row's best) by tokens per batch\n")
    print("| shape (intermediate) | auto | " + " | ".join(str(s) for s in SIZES) + " |")
    print("| --- | ---: |" + " ---: |" * len(SIZES))
    for name in args.shapes:
        hidden, layers, heads, intermediate = SHAPES[name]
        torch.manual_seed(0)
        config = BertConfig(vocab_size=30522, hidden_size=hidden, num_hidden_layers=layers,
                            num_attention_heads=heads, intermediate_size=intermediate)
        model = fuse_attention_projections(BertForPreTraining(config).eval())  # as the service serves float32
        engine = Engine(model, torch.device("cpu"), torch.float32)
        timings = {size: seconds_per_token(engine, size) for size in SIZES}
        fastest = min(timings.values())
        cells = " | ".join(f"{t * 1e6:.2f} ({t / fastest:.2f})" for t in timings.values())
        print(f"| {name} ({intermediate}) | {batch_tokens_for_width(intermediate, 4, 16384)} | {cells} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
