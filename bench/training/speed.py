"""Training benchmark: our trainer vs a plain transformers loop, same data, config, batch and budget.

Both train on the offline reference recipe for the same minutes of step time (evaluation and
saving are not counted), one after the other on this machine; then both checkpoints are scored on
the same held-out pairs with the same fixed masks by the same code (`trainer.evaluate`).

MFU here is model FLOPs per second over the FLOPs per second that this machine's float32 matmul
reaches (measured in the same run). Model FLOPs per token, forward x 3 for forward + backward:
dense layers + attention at --max-seq-len + the MLM head on the masked share only, which is the
work the objective needs; the peer's head over every position is counted as waste, not as work.

    python -m bench.training.speed --minutes 10
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import torch

from bench.training.peer import PEER_RUN_FILE
from devkit.paths import WIKITEXT_TEST, WIKITEXT_VALID
from model.checkpoint import load_checkpoint, read_metadata
from model.flops import model_flops_per_token
from trainer.data.pipeline import prepare
from trainer.evaluate import build_eval_set, evaluate
from trainer.options import TrainOptions


def matmul_peak_flops(size: int = 2048, repeats: int = 10) -> float:
    """Best float32 matmul FLOP/s of this machine at the trainer's thread count."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.mm(a, b)
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        best = max(best, 2 * size**3 / (time.perf_counter() - start))
    return best


def run(command: list[str], log: Path) -> None:
    print("$", " ".join(command), flush=True)
    with open(log, "w") as handle:
        done = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        sys.exit(f"{command[2]} failed (exit {done.returncode}); see {log}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--corpus", default=str(WIKITEXT_VALID))
    parser.add_argument("--eval-corpus", default=str(WIKITEXT_TEST))
    parser.add_argument("--preset", default="mini")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=TrainOptions.lr)
    parser.add_argument("--work", type=Path, default=Path("runs/bench-training"))
    parser.add_argument("--systems", nargs="+", default=["ours", "transformers"], choices=["ours", "transformers"])
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    cache = args.work / "cache"
    shared = ["--corpus", args.corpus, "--eval-corpus", args.eval_corpus, "--preset", args.preset,
              "--batch-size", str(args.batch_size), "--lr", str(args.lr), "--time-budget", str(args.minutes),
              "--seed", "0", "--cache-dir", str(cache)]
    commands = {
        "ours": [sys.executable, "-m", "trainer", *shared, "--output", str(args.work / "ours"), "--no-progress"],
        "transformers": [sys.executable, "-m", "bench.training.peer", *shared, "--output", str(args.work / "transformers")],
    }
    peak = matmul_peak_flops()
    for system in args.systems:
        run(commands[system], args.work / f"{system}.log")

    options = TrainOptions(corpus=args.corpus, eval_corpus=args.eval_corpus, output=args.work / "unused",
                           preset=args.preset, cache_dir=cache, progress=False)
    data = prepare(options)
    rows = []
    for system in args.systems:
        directory = args.work / system
        checkpoint = load_checkpoint(directory)
        eval_set = build_eval_set(data.eval, checkpoint.tokenizer, checkpoint.config.vocab_size, options.max_seq_len,
                                  examples=1_000_000)  # every held-out pair
        scores = evaluate(checkpoint.model, eval_set, torch.device("cpu"))
        record = read_metadata(directory) if system == "ours" else json.loads((directory / PEER_RUN_FILE).read_text())
        progress = record["progress"]
        steps, tokens, seconds = progress["step"], progress["tokens_seen"], progress["elapsed_s"]
        flops_per_token = 3 * model_flops_per_token(checkpoint.config, options.max_seq_len, options.mask_rate)
        rows.append({"system": system, "steps": steps, "tokens_per_s": tokens / seconds,
                     "model_gflops_per_s": tokens / seconds * flops_per_token / 1e9,
                     "mfu": tokens / seconds * flops_per_token / peak, **scores})

    print(f"# {date.today()} {platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}; "
          f"{args.preset}, batch {args.batch_size}, lr {args.lr}, {args.minutes:g} min of steps each")
    print(f"# float32 matmul peak measured: {peak / 1e9:.1f} GFLOP/s; held-out pairs: {rows[0]['pairs']}, "
          f"masked tokens: {rows[0]['masked_tokens']}")
    print("| system | steps | tokens/s | model GFLOP/s | MFU | masked acc | MLM ppl | NSP acc | tokens/s vs transformers |")
    print("|---|---|---|---|---|---|---|---|---|")
    baseline = next((r["tokens_per_s"] for r in rows if r["system"] == "transformers"), None)
    for r in rows:
        ratio = f"{r['tokens_per_s'] / baseline:.2f}x" if baseline else "-"
        print(f"| {r['system']} | {r['steps']} | {r['tokens_per_s']:,.0f} | {r['model_gflops_per_s']:.1f} | "
              f"{r['mfu']:.1%} | {r['mlm_accuracy']:.2%} | {r['mlm_perplexity']:.1f} | {r['nsp_accuracy']:.2%} | {ratio} |")
    (args.work / "results.json").write_text(json.dumps({"peak_flops": peak, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
