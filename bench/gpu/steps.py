"""The steps of `python -m bench.gpu` beyond the tests: serving against the in-process limit (bench.serving),
a BERT-base-shaped checkpoint to serve and train, a py-spy profile of the service under load, torch.profiler's
top kernels of one engine batch, and the trainer's tokens/s and MFU. Each returns plain JSON-able data, or
{"error": ...} so that one failing step does not hide the others' figures."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.gpu.env import program
from devkit.paths import REPO_ROOT, WIKITEXT_TEST, WIKITEXT_VALID
from service.settings import DEFAULT_CHECKPOINT

# What the service is measured at: clients x sentences per request, the loads the targets name (issue #53; 16 x 8
# was left out to fit the run in 6 minutes).
LOADS = ("64x8", "64x1")
# The service in dtype auto and float32 (at 64 x 8, where bfloat16 >= float32 is judged); the transformers peer at the
# load its comparison uses (one forward per request: its 64-client rows wait seconds for their last answers).
SYSTEMS = ("service", "service:float32@64x8", "naive@64x8")
# The in-process limit's batch sizes: the service's own (--max-batch-size auto, 256 on a GPU) and half of it.
LIMIT_BATCH_SIZES = ("128", "256")
# The bundled model's service without CUDA graphs, where batches are many and small: what the graphs gain, same run.
EAGER = "service::--no-cuda-graphs@64x8,64x1"


def base_checkpoint(work: Path, dry_run: bool) -> Path:
    """A BERT-base-shaped checkpoint (random weights, the bundled tokenizer), built here: no download.
    The dry run builds a tiny one of the same layout."""
    import torch

    from model import BertConfig, BertForPreTraining, load_checkpoint, save_checkpoint

    tokenizer = load_checkpoint(DEFAULT_CHECKPOINT).tokenizer
    sizes = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=1, intermediate_size=128) if dry_run else \
        dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(vocab_size=tokenizer.vocab_size, max_position_embeddings=512, **sizes))
    return save_checkpoint(work / "bert-base-random", model, tokenizer,
                           metadata={"note": "random weights in BERT-base's shape, for bench.gpu"})


def serving(checkpoint: Path, work: Path, dry_run: bool, duration: float, service_args: str = "",
            ceiling: bool = False, systems=SYSTEMS, loads=LOADS) -> dict:
    """bench.serving: the service (dtype auto and float32) and the naive transformers peer, each row against
    the in-process limit of its dtype; the clients spread over several processes (bench.serving.load)."""
    rows_file = work / f"serving-{checkpoint.name}.json"
    processes = 2 if dry_run else min(8, max(2, (os.cpu_count() or 4) // 2))
    command = [sys.executable, "-m", "bench.serving", "--checkpoint", str(checkpoint),
               "--load", *loads, "--client-processes", str(processes),
               "--duration", str(duration), "--sentences", "32" if dry_run else "2000",
               "--systems", *systems, "--json", str(rows_file),
               "--batch-sizes", *(["8"] if dry_run else LIMIT_BATCH_SIZES),
               *(["--service-args", service_args] if service_args else []), *(["--ceiling"] if ceiling else [])]
    started = time.perf_counter()
    result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True)
    if result.returncode:
        return {"error": result.stderr[-1500:], "command": " ".join(command)}
    keep = ("system", "concurrency", "inputs_per_request", "sequences_per_s", "requests_per_s", "p50_ms", "p99_ms",
            "mean_batch", "padding", "vs_limit", "batch_ms", "engine_busy", "queue_ms", "graphed", "graph_padding",
            "server_ms", "engine_round_trip_ms", "interpreter_lag_ms", "engine_cores", "engine_threads",
            "front_end_cores")
    rows = [{k: r[k] for k in keep} for r in json.loads(rows_file.read_text())]
    # bench.serving's own notes: one input's forward pass, and the limit at every batch size tried (the service's
    # batches are compared with the limit at their own size, not only at the best one)
    notes = [line.removeprefix("# ") for line in result.stdout.splitlines()
             if line.startswith(("# one forward pass", "# in-process", "# limit's engine"))]
    return {"rows": rows, "client_processes": processes, "seconds": round(time.perf_counter() - started, 1),
            "service_args": service_args or "(none: the service's default --workers)", "notes": notes}


LOAD_START_S = 2.0  # the load generator's processes start (each imports little) before py-spy records


PY_SPY_RATE = 100  # samples per second per thread


RERANK_RATE_GPU = 20.0  # several_models: the reranker's requests a second on a GPU (its docstring)


def several_models(work: Path, dry_run: bool, duration: float) -> dict:
    """bench.serving.several_models on this machine: three models in one server against each alone and against two
    single-model servers, its targets' lines beside the figures (Infinity is not on a GPU machine); one round of each
    row, within the step's time in the run's budget (a GPU host is not shared, so its rows drift less), and the three
    models once more with --gpu-express-lane (docs/several-models.md). The reranker
    sends RERANK_RATE_GPU requests a second: a GPU answers one in about 10 ms, and at the CPU's 2 a second a 6-second
    row held 11 requests, whose p99 is their slowest."""
    found = work / "several-models.json"
    command = [sys.executable, "-m", "bench.serving.several_models", "--skip", "infinity", "--json", str(found),
               *(["--quick"] if dry_run else ["--seconds", str(max(4.0, 3 * duration)), "--rounds", "1",
                                              "--rerank-rate", str(RERANK_RATE_GPU), "--gpu-express-lane-row",
                                              "--client-processes", str(min(8, max(2, (os.cpu_count() or 4) // 2)))])]
    result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        return {"error": result.stderr[-1500:]}
    return json.loads(found.read_text())


def py_spy_profile(checkpoint: Path, work: Path, dry_run: bool, seconds: float) -> dict:
    """py-spy over the service and all its processes while 64 clients (4 in the dry run) send 8 sentences a
    request: the functions holding most samples, on top of the stack (self) and anywhere in it, and how busy
    each thread was (which one is the limit: an event loop at one core, the engine's batching thread, ...)."""
    from bench.serving.load import drive_processes
    from bench.serving.throughput import count_tokens, sentences
    from devkit.server import start_service
    from model import load_checkpoint

    tokenizer = load_checkpoint(checkpoint).tokenizer
    texts = sentences(64 if dry_run else 2000, None, tokenizer)
    process, url = start_service(checkpoint)
    raw = work / "py-spy.txt"
    # The clients run for the whole recording: their processes take a few seconds to start and warm up
    # (py-spy leaves idle samples out, so a recording of an idle server has none).
    load = threading.Thread(target=drive_processes, args=(
        url, texts, 4 if dry_run else 64, seconds + LOAD_START_S + 2, count_tokens(tokenizer, texts), "encode",
        2 if dry_run else 8, 2 if dry_run else 4))
    try:
        load.start()
        time.sleep(LOAD_START_S)
        spy = subprocess.run([program("py-spy") or "py-spy", "record", "--subprocesses", "--nonblocking",
                              "--threads",
                              "--format", "raw", "--rate", str(PY_SPY_RATE), "--duration", str(int(seconds)),
                              "--pid", str(process.pid), "--output", str(raw)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=seconds + 60)
        output = spy.stdout
        load.join()
    except (OSError, subprocess.TimeoutExpired) as error:
        return {"error": f"py-spy did not run: {error}"}
    finally:
        process.terminate()
        process.wait(timeout=60)
    if spy.returncode or not raw.exists():
        return {"error": f"py-spy exited {spy.returncode}: {output[-800:]}"}
    return summarize_stacks(raw.read_text().splitlines(), samples_per_busy_thread=PY_SPY_RATE * int(seconds))


def summarize_stacks(lines: list[str], top: int = 15, samples_per_busy_thread: int | None = None) -> dict:
    """py-spy's raw (collapsed) stacks, "frame;frame;...;leaf COUNT", -> each function's share of the samples.
    With --subprocesses --threads the stacks start with "process PID:..." (parent, then child) and
    "thread (TID): NAME" frames: each thread's samples over `samples_per_busy_thread` (what a thread busy the
    whole recording would have: idle samples are left out) is how many cores it kept busy, with its top function."""
    own, anywhere, total = collections.Counter(), collections.Counter(), 0
    threads: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for line in lines:
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [frame.strip() for frame in stack.split(";") if frame.strip()]
        place = [f for f in frames if f.startswith(("process ", "thread ("))]
        frames = [f for f in frames if not f.startswith(("process ", "thread ("))]
        if not frames:
            continue
        total += int(count)
        own[frames[-1]] += int(count)
        for frame in set(frames):
            anywhere[frame] += int(count)
        if place:  # the innermost process (its pid) and the thread's name
            processes = [f.split(":")[0].removeprefix("process ") for f in place if f.startswith("process ")]
            pid = processes[-1] if processes else "?"
            name = next((f.split(":", 1)[-1].strip() for f in place if f.startswith("thread (")), "?")
            threads[f"{pid} {name}"][frames[-1]] += int(count)

    def share(counter: collections.Counter) -> list[dict]:
        return [{"function": f, "share": round(n / total, 4)} for f, n in counter.most_common(top)] if total else []

    summary = {"samples": total, "self": share(own), "inclusive": share(anywhere)}
    if threads and samples_per_busy_thread:
        busiest = sorted(threads.items(), key=lambda kv: -sum(kv[1].values()))
        summary["threads"] = [{"thread": name, "busy_cores": round(sum(c.values()) / samples_per_busy_thread, 3),
                               "top": [f for f, _ in c.most_common(3)]} for name, c in busiest[:top]]
        summary["busy_cores"] = round(total / samples_per_busy_thread, 2)
    return summary


def kernel_profile(checkpoint: Path, device: str, dry_run: bool) -> dict:
    """torch.profiler over one engine batch (128 WikiText sentences, dtype auto): the kernels (CPU: the
    operators) taking the most device time, and whether attention ran as varlen FlashAttention."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from bench.serving.throughput import sentences
    from model import load_checkpoint
    from model.attention import runs_varlen
    from service.engine.precision import choose
    from service.engine.loader import build_engine
    from service.tasks import EncodeItem

    ckpt = load_checkpoint(checkpoint)
    engine = build_engine(ckpt, torch.device(device), choose("auto", torch.device(device)))
    encoded = ckpt.tokenizer.encode_batch(sentences(8 if dry_run else 128, None, ckpt.tokenizer), truncate=True)
    batch = engine.collate([EncodeItem(e.ids, e.type_ids, pooling="mean") for e in encoded])
    for _ in range(1 if dry_run else 3):
        engine.run(batch)  # warm-up: allocator, kernel selection
    cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        engine.run(batch)
        if cuda:
            torch.cuda.synchronize()
    events = prof.key_averages()
    if cuda:
        kernels = [e for e in events if "CUDA" in str(getattr(e, "device_type", ""))]
        timed = [(e.key, getattr(e, "device_time_total", getattr(e, "cuda_time_total", 0)), e.count)
                 for e in kernels]
    else:
        timed = [(e.key, e.self_cpu_time_total, e.count) for e in events]
    timed.sort(key=lambda t: -t[1])
    total = sum(t[1] for t in timed) or 1
    dtype = engine.dtype
    return {"batch": batch.size, "real_tokens": batch.real_tokens, "padded_tokens": batch.padded_tokens,
            "dtype": str(dtype).removeprefix("torch."), "time_us": round(total, 1),
            "varlen_attention": runs_varlen(torch.device(device), dtype, ckpt.model.config.head_dim),
            "top": [{"name": name[:120], "us": round(us, 1), "share": round(us / total, 4), "calls": calls}
                    for name, us, calls in timed[:15]]}


def training_corpora(work: Path, dry_run: bool) -> tuple[Path, Path]:
    """WikiText-2's validation split to train on and its test split to evaluate on; the dry run: their first
    articles only (the same steps in seconds)."""
    corpus, held_out = WIKITEXT_VALID, WIKITEXT_TEST
    if dry_run:
        corpus, held_out = work / "train.tokens", work / "eval.tokens"
        for source, target in ((WIKITEXT_VALID, corpus), (WIKITEXT_TEST, held_out)):
            if not target.exists():
                target.write_text("".join(source.read_text(encoding="utf-8").splitlines(keepends=True)[:120]))
    return corpus, held_out


def training_profile(work: Path, dry_run: bool, base: Path, out: Path) -> dict:
    """bench.gpu.training_profile in its own process: where one pre-training step's time goes on the
    BERT-base shape (host batch building and dispatch, the device's busy share, kernel time by kind), with
    a gzipped Chrome trace of the profiled steps in `out`."""
    corpus, held_out = training_corpora(work, dry_run)
    figures = work / "training-profile.json"
    command = [sys.executable, "-m", "bench.gpu.training_profile", "--init-from", str(base), "--corpus", str(corpus),
               "--eval-corpus", str(held_out), "--work", str(work / "training-profile"), "--json", str(figures),
               "--trace", str(out / "training-trace.json.gz"), *(["--dry-run"] if dry_run else [])]
    result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True)
    if result.returncode:
        return {"error": result.stderr[-1500:]}
    return json.loads(figures.read_text())


TRAINING_RUNS = ("bert-base", "train-default")
WITHOUT_GRAPHS = ("bert-base-no-graphs",)


def training(device: str, work: Path, dry_run: bool, peak: float, base: Path, names: tuple[str, ...] = TRAINING_RUNS
             ) -> dict:
    """The trainer's tokens/s and MFU (model FLOPs over the measured matmul peak) of the runs `names`: on the
    BERT-base shape (`base`: warm-started from, so with the bundled tokenizer; bfloat16 on a GPU, torch.compile,
    its step as CUDA graphs, or with WITHOUT_GRAPHS launched kernel by kernel), and on `make train-default`'s recipe
    (the bundled model's shape, batch 32, as the Makefile runs it) for the wall-clock that recipe's tokens would take
    here."""
    from model import load_checkpoint
    from model.flops import model_flops_per_token

    corpus, held_out = training_corpora(work, dry_run)
    gpu = device.startswith("cuda")
    seq_len = 64 if dry_run else 128
    base_flags = ["--precision", "bfloat16" if gpu else "float32"] + (["--compile"] if gpu else [])
    runs = {  # name: (checkpoint warm-started from, steps, batch, flags)
        "bert-base": (base, 2 if dry_run else 50, 8 if dry_run else 256, base_flags),  # the last 2/3 timed
        "train-default": (DEFAULT_CHECKPOINT, 2 if dry_run else 60, 8 if dry_run else 32,
                          ["--preserve-embeddings", "100", "--preserve-over", "clean", "--encoder-lr-scale", "0.1",
                           "--dropout", "0", "--mask-rate", "0.2", "--lr", "6e-4", "--warmup-fraction", "0.02"]),
        # the same step compiled for changing shapes: what the CUDA graphs gain (timed past its compilation)
        "bert-base-no-graphs": (base, 2 if dry_run else 30, 8 if dry_run else 256, base_flags + ["--no-cuda-graphs"]),
    }
    results = {}
    for name, (start, steps, batch, flags) in ((name, runs[name]) for name in names):
        output = work / f"train-{name}"
        command = [sys.executable, "-m", "trainer", "--corpus", str(corpus), "--eval-corpus", str(held_out),
                   "--output", str(output), "--init-from", str(start), "--max-seq-len", str(seq_len),
                   "--batch-size", str(batch), "--max-steps", str(steps), "--eval-every", str(steps),
                   "--eval-examples", "16" if dry_run else "64", "--log-every", "2" if dry_run else "10",
                   "--no-progress",
                   "--cache-dir", str(work / "cache"), "--device", device, *flags]
        result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True)
        if result.returncode:
            results[name] = {"error": result.stderr[-1500:]}
            continue
        rows = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
        timed = [r for r in rows if "tokens_per_s" in r]
        speeds = [r["tokens_per_s"] for r in timed]
        speeds = speeds[len(speeds) // 3:] or speeds  # past compilation and warm-up
        tokens_per_s = sum(speeds) / max(len(speeds), 1)
        config = load_checkpoint(start).model.config
        model_tflops = tokens_per_s * 3 * model_flops_per_token(config, seq_len, 0.15) / 1e12
        results[name] = {"tokens_per_s": round(tokens_per_s, 1), "model_tflops": round(model_tflops, 3),
                         "mfu_vs_measured_peak": round(model_tflops / peak, 4), "steps": steps, "batch": batch,
                         "hidden": config.hidden_size, "layers": config.num_hidden_layers, "flags": flags,
                         # present where the step was to replay as CUDA graphs: graphs inductor ran without them
                         **{key: value for key, value in timed[-1].items() if key == "cuda_graph_skips"}}
    recipe = results.get("train-default", {})
    if "tokens_per_s" in recipe:  # the bundled model's own training: tokens it saw over this rate
        progress = json.loads((DEFAULT_CHECKPOINT / "training_metadata.json").read_text())["progress"]
        recipe["recipe_tokens"] = progress["tokens_seen"]
        recipe["recipe_hours_here"] = round(progress["tokens_seen"] / recipe["tokens_per_s"] / 3600, 3)
    return results
