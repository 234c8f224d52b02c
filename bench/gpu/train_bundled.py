"""The bundled model trained on a GPU in one command (`make train-bundled-gpu`): a warm start from the bundled
model on a prepared slice of Wikipedia (`make gpu-corpus`), for a few minutes, handed back in parts.

On a GPU machine without network, after the acceptance run or alone, within about 8 minutes of the machine:

    python3 -m bench.gpu.train_bundled --out OUT

1. `python -m trainer` on the prepared corpus (token ids: nothing to split or tokenize on the host), warm-started from
   checkpoints/minilm-wikipedia, `--minutes` of training steps (5 by default), a resumable checkpoint every minute
   (`--save-every-minutes 1`), bfloat16 autocast, the step compiled and replayed as CUDA graphs, batches of 1024
   pairs of 128 tokens (RECIPE: the reasons are beside each flag);
2. past `--deadline-minutes` (8) the trainer is stopped (SIGTERM: it saves where it is) so that something comes back;
3. the final checkpoint (or, if the run was stopped, the newest resumable one, weights cast to float16) is packed into
   OUT in parts of at most 16 MiB with a manifest of sha256 hashes (bench.gpu.parts), beside `train-summary.json`
   (tokens/s, steps, the final evaluation, whether the compiled step fell back) and the trainer's log.

Here, afterwards: `make gpu-model-join PARTS=DIR` checks the hashes, unpacks, and exports the checkpoint for the
quality gate (docs/gpu.md). `--dry-run` runs the same chain on the CPU in seconds (tests/bench/test_train_bundled.py).
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from devkit.paths import REPO_ROOT

CORPUS = REPO_ROOT / ".data" / "gpu-corpus" / "wikipedia"
WARM_START = REPO_ROOT / "checkpoints" / "minilm-wikipedia"
SERVABLE = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
            "vocab.txt", "training_metadata.json", "metrics.jsonl")
TARGET_TOKENS_PER_S = 1_000_000  # issue #53: the bundled shape on an H200, for minutes of training to matter

# `make train-default`'s recipe (the warm start's, docs/model-making.md), changed where a GPU's minutes differ from a
# CPU's hours: 1024 pairs a step, not 32 (131k tokens: a step costs the device ~0.1 s at 1M tokens/s, so the host's
# launches are small beside it), the learning rate raised with it (a warm start: well below the sqrt rule's
# 3.4e-3), no frozen-encoder steps (the heads are trained already), dropout 0.1 (the slice is seen
# many times over: 300M tokens of a 6M-token slice), three processes building the batches (one built 0.7M tokens/s of
# them on this project's CPU, three 1.0M: `python -m bench.gpu.batch_cost`, docs/gpu.md).
RECIPE = ["--batch-workers", "3", "--batch-size", "1024", "--max-seq-len", "128", "--lr", "1e-3",
          "--warmup-fraction", "0.05", "--mask-rate", "0.2", "--dropout", "0.1", "--preserve-embeddings", "100",
          "--preserve-over", "clean",
          "--encoder-lr-scale", "0.1", "--precision", "bfloat16", "--compile", "--save-dtype", "float16"]
DRY_RECIPE = ["--batch-size", "8", "--max-seq-len", "64", "--lr", "1e-4", "--mask-rate", "0.2", "--dropout", "0",
              "--preserve-embeddings", "100", "--preserve-over", "clean", "--precision", "float32",
              "--save-dtype", "float16", "--eval-examples", "16"]


def trainer_command(corpus: Path, output: Path, cache: Path, minutes: float, dry_run: bool,
                    extra: list[str]) -> list[str]:
    length = ["--max-steps", "4"] if dry_run else ["--time-budget", str(minutes)]
    return [sys.executable, "-m", "trainer", "--corpus", str(corpus), "--init-from", str(WARM_START),
            "--output", str(output), "--cache-dir", str(cache), *length, "--save-every", "1000000",
            "--save-every-minutes", "1", "--eval-every", "1000000", "--log-every", "2" if dry_run else "20",
            "--no-progress", "--device", "cpu" if dry_run else "cuda", *(DRY_RECIPE if dry_run else RECIPE), *extra]


def run_until(command: list[str], log: Path, deadline: float) -> tuple[int, bool]:
    """(the trainer's exit code, whether it had to be stopped at the deadline: SIGTERM, it saves and exits)."""
    with open(log, "w") as out:
        process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT)
        try:
            return process.wait(timeout=max(1.0, deadline - time.monotonic())), False
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGTERM)
            try:
                return process.wait(timeout=90), True
            except subprocess.TimeoutExpired:
                process.kill()
                return process.wait(), True


def newest_weights(output: Path, into: Path) -> tuple[Path, str] | None:
    """The directory to pack: the run's final checkpoint, else its newest resumable one with its weights cast to
    float16 (half the bytes to hand back) in `into`; None if the run saved nothing."""
    if (output / "training_metadata.json").is_file() and (output / "model.safetensors").is_file():
        return output, "final"
    saved = sorted((output / "checkpoints").glob("step-*")) if (output / "checkpoints").is_dir() else []
    if not saved:
        return None
    from safetensors.torch import load_file, save_file

    newest = saved[-1]
    into.mkdir(parents=True, exist_ok=True)
    weights = {k: v.half() if v.is_floating_point() else v for k, v in load_file(newest / "model.safetensors").items()}
    save_file(weights, into / "model.safetensors", metadata={"format": "pt"})
    for name in SERVABLE:
        if name != "model.safetensors" and (newest / name).is_file():
            (into / name).write_bytes((newest / name).read_bytes())
    if (output / "metrics.jsonl").is_file():
        (into / "metrics.jsonl").write_bytes((output / "metrics.jsonl").read_bytes())
    return into, newest.name


def speed(metrics: Path) -> dict:
    """Mean tokens/s of the logged windows past the first (compilation and graph capture), and their count."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
    timed = [r for r in rows if "tokens_per_s" in r]
    later = timed[1:] or timed
    evals = [r["eval"] for r in rows if "eval" in r]
    return {"tokens_per_s": round(sum(r["tokens_per_s"] for r in later) / len(later), 1) if later else None,
            "logged_windows": len(timed), "steps": timed[-1]["step"] if timed else 0,
            "model_tflops": later[-1].get("model_tflops") if later else None,
            # the share of the time the loop waited for its batches: the input pipeline's part in a shortfall
            "input_wait": round(sum(r.get("input_wait", 0.0) for r in later) / len(later), 4) if later else None,
            "final_eval": evals[-1] if evals else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu.train_bundled", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=CORPUS, help="a prepared corpus (make gpu-corpus)")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "runs" / "gpu-bundled-parts")
    parser.add_argument("--minutes", type=float, default=5.0, help="minutes of training steps (--time-budget)")
    parser.add_argument("--deadline-minutes", type=float, default=8.0,
                        help="stop the trainer this long after the start, whatever it is doing, and pack what it saved")
    parser.add_argument("--work", type=Path, default=None, help="the run's directory (default: a temporary one)")
    parser.add_argument("--dry-run", action="store_true", help="the same chain on the CPU: 4 steps, small batches")
    parser.add_argument("trainer_args", nargs="*", help="more trainer flags, after --, e.g. -- --batch-size 512")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    # Nothing to install: the trainer on a prepared corpus needs only what a GPU machine's Python has (torch, numpy,
    # tokenizers, safetensors, matplotlib), so no wheels need travel beside the corpus.
    started = time.monotonic()
    if not (args.corpus / "prepared.json").is_file():
        print(f"error: {args.corpus} is no prepared corpus; run `make gpu-corpus` first", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="train-bundled-") as scratch:
        work = args.work or Path(scratch)
        output = work / "run"
        command = trainer_command(args.corpus, output, work / "cache", args.minutes, args.dry_run, args.trainer_args)
        log = args.out / "train.log"
        code, stopped = run_until(command, log, started + 60 * args.deadline_minutes)
        chosen = newest_weights(output, work / "packed")
        summary = {"command": " ".join(["python -m bench.gpu.train_bundled", *argv]),
                   "trainer": " ".join(command[1:]), "exit_code": code, "stopped_at_deadline": stopped,
                   "seconds": round(time.monotonic() - started, 1), **speed(output / "metrics.jsonl"),
                   "target_tokens_per_s": TARGET_TOKENS_PER_S}
        if chosen is not None:
            directory, which = chosen
            metadata = json.loads((directory / "training_metadata.json").read_text())
            summary.update(packed=which, compiled_step=metadata.get("compiled_step"),
                           device=metadata.get("device"), progress=metadata.get("progress"))
            from bench.gpu.parts import pack

            manifest = pack(directory, args.out, [name for name in SERVABLE if (directory / name).is_file()])
            summary["parts"] = {"count": len(manifest["parts"]), "bytes": manifest["bytes"],
                                "sha256": manifest["sha256"]}
        (args.out / "train-summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    if chosen is None:
        print(f"error: the run saved nothing (exit {code}); its log: {log}", file=sys.stderr)
        return 1
    return 0 if code == 0 or stopped else 1


if __name__ == "__main__":
    sys.exit(main())
