"""Where a pre-training step's time goes: `python -m bench.gpu.training_profile --init-from DIR --corpus F
--eval-corpus F --work DIR --json F [--trace F.json.gz] [--dry-run]` (a step of `python -m bench.gpu`).

The trainer's own loop pieces (trainer.loop.Training, trainer.data.batches.BatchStream), in this process, on the
BERT-base shape (bfloat16, compiled; the dry run: the CPU, small, eager): after warm-up steps (compilation, padded
and unpadded batches), the host's milliseconds per step taking the batch (built ahead on a GPU) and dispatching
the step, the wall-clock per step with the device waited for, then torch.profiler over a few steps: the device's kernel time per step (so the share of the
wall-clock the device was busy: low means the host or a wait is the limit, not the kernels), that time by kind
(matrix products, attention, fused elementwise, optimizer, copies) and the top kernels and host calls.
Run in its own process: the compiler's settings are process-wide (trainer.forward.trace_whole).
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import shutil
import sys
import time
from pathlib import Path

# Kernel name fragments -> kind, first match wins (cuBLAS / cuBLASLt / CUTLASS names on Hopper, FlashAttention,
# Inductor's generated Triton kernels, the fused AdamW, copies).
KINDS = (("attention", ("flash", "fmha", "attention", "efficient")),
         ("matrix product", ("gemm", "nvjet", "cutlass", "xmma", "sm90_", "cublas", "matmul")),
         ("optimizer", ("adam", "multi_tensor", "foreach")),
         ("fused elementwise (Triton)", ("triton",)),
         ("copy / fill", ("memcpy", "memset", "copy", "fill")),
         ("reduction / norm", ("reduce", "norm", "softmax")))


def kind_of(kernel: str) -> str:
    name = kernel.lower()
    return next((kind for kind, parts in KINDS if any(p in name for p in parts)), "other")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu.training_profile", description=__doc__)
    parser.add_argument("--init-from", type=Path, required=True, help="the checkpoint trained from (its shape)")
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--eval-corpus", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True, help="a scratch directory (run files, caches)")
    parser.add_argument("--json", type=Path, required=True, help="where the figures go")
    parser.add_argument("--trace", type=Path, default=None, help="a gzipped Chrome trace of the profiled steps")
    parser.add_argument("--dry-run", action="store_true", help="the CPU, small batches, eager")
    parser.add_argument("--batch-size", type=int, default=None)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    import torch
    from torch.profiler import ProfilerActivity, profile

    from model.flops import model_flops_per_token
    from trainer.cli import build_parser
    from trainer.data.batches import BatchStream
    from trainer.loop import Training
    from trainer.options import TrainOptions
    from trainer.placement import place

    cuda = not args.dry_run and torch.cuda.is_available()
    seq_len, batch_size = (64, args.batch_size or 8) if args.dry_run else (128, args.batch_size or 256)
    warm_steps, timed_steps, profiled_steps = (1, 2, 1) if args.dry_run else (20, 30, 3)
    flags = ["--corpus", str(args.corpus), "--eval-corpus", str(args.eval_corpus), "--output",
             str(args.work / "profile-run"), "--init-from", str(args.init_from), "--max-seq-len", str(seq_len),
             "--batch-size", str(batch_size), "--max-steps", "1000", "--eval-examples", "16", "--no-progress",
             "--cache-dir", str(args.work / "cache"), "--device", "cuda" if cuda else "cpu",
             "--precision", "bfloat16" if cuda else "float32", *(["--compile"] if cuda else [])]
    options = TrainOptions(**vars(build_parser().parse_args(flags)))
    training = Training(options, place(options))
    progress = training.progress
    synchronize = torch.cuda.synchronize if cuda else (lambda: None)
    batches = BatchStream(training.pairs, progress.step, progress.cursors, options, training.data, training.replace,
                          ahead=cuda, fixed_shapes=training.cuda_graphs)

    def one_step() -> tuple[float, float, int]:
        """(host seconds taking the batch, host seconds dispatching the step, real tokens)."""
        started = time.perf_counter()
        taken = batches.next(progress.step)
        batch, masked = taken.batch, taken.masked
        built = time.perf_counter()
        training.gradient_step(batch, masked, progress.step)
        progress.step += 1
        return built - started, time.perf_counter() - built, batch.num_real_tokens

    compile_started = time.perf_counter()
    for _ in range(warm_steps):
        one_step()
    synchronize()
    warm_up_s = time.perf_counter() - compile_started
    started = time.perf_counter()
    steps = [one_step() for _ in range(timed_steps)]
    synchronize()
    wall_ms = (time.perf_counter() - started) * 1e3 / timed_steps
    tokens_per_s = sum(s[2] for s in steps) / (wall_ms * timed_steps / 1e3)
    flops_per_token = 3 * model_flops_per_token(training.model.config, seq_len, options.mask_rate)

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(profiled_steps):
            one_step()
        synchronize()
    events = prof.key_averages()
    if cuda:
        device_events = [(e.key, getattr(e, "device_time_total", 0), e.count) for e in events
                         if "CUDA" in str(getattr(e, "device_type", ""))]
    else:  # no device: the operators' own CPU time stands in, so the dry run exercises the same summary
        device_events = [(e.key, e.self_cpu_time_total, e.count) for e in events if e.key.startswith("aten::")]
    device_events.sort(key=lambda e: -e[1])
    device_us = sum(e[1] for e in device_events) / profiled_steps
    by_kind: collections.Counter[str] = collections.Counter()
    for name, us, _ in device_events:
        by_kind[kind_of(name)] += us / profiled_steps
    host = sorted(((e.key, e.self_cpu_time_total / profiled_steps, e.count / profiled_steps) for e in events),
                  key=lambda e: -e[1])
    result = {
        "device": torch.cuda.get_device_name(0) if cuda else "cpu", "batch": batch_size, "seq_len": seq_len,
        "compiled": options.compile, "cuda_graphs": training.cuda_graphs, "warm_up_s": round(warm_up_s, 1),
        "timed_steps": timed_steps,
        "wall_ms_per_step": round(wall_ms, 2),
        "host_batch_ms": round(sum(s[0] for s in steps) * 1e3 / timed_steps, 2),
        "host_dispatch_ms": round(sum(s[1] for s in steps) * 1e3 / timed_steps, 2),
        "tokens_per_s": round(tokens_per_s, 1), "model_tflops": round(tokens_per_s * flops_per_token / 1e12, 2),
        "device_ms_per_step": round(device_us / 1e3, 2),
        "device_busy_share": round(device_us / 1e3 / wall_ms, 3),
        "kernels_per_step": round(sum(e[2] for e in device_events) / profiled_steps, 1),
        "device_ms_by_kind": {k: round(v / 1e3, 2) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
        "top_kernels": [{"name": n[:110], "ms_per_step": round(us / profiled_steps / 1e3, 3),
                         "calls_per_step": round(c / profiled_steps, 1)} for n, us, c in device_events[:12]],
        "top_host_calls": [{"name": n[:80], "ms_per_step": round(us / 1e3, 3), "calls_per_step": round(c, 1)}
                           for n, us, c in host[:12]],
    }
    batches.close()
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    if args.trace is not None:
        raw = args.work / "trace.json"
        prof.export_chrome_trace(str(raw))
        with raw.open("rb") as source, gzip.open(args.trace, "wb") as target:
            shutil.copyfileobj(source, target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
