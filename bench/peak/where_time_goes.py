"""Where the int8 engine's time goes in bulk, on one core: py-spy samples (native frames included) of the engine
running large batches on one thread, each sample put in the first category its stack names, from the innermost
frame out: the int8 products (VNNI or AVX2), attention, quantization, residual + LayerNorm, the rest of the C
layer's steps (dequantization and GELU, which the compiler inlines into the layer's body), torch's own operations
(embeddings, pooling, copies), Python.

One thread, because the bulk limit runs one batch a core (bench/serving/in_process_limit.py): each core's time is
this. The engine runs in a child process (`--engine-loop`), which py-spy attaches to once it is warm.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

# (category, the frame-name prefixes that put a sample in it), searched in this order from the innermost frame out.
CATEGORIES = (
    ("int8 products", ("rows_times_blocks", "products_share", "products_part", "matmul_blocked")),
    ("attention (float32)", ("attention_share", "attend_packed", "attend_head")),
    ("quantize rows", ("quantize_rows",)),
    ("residual + LayerNorm", ("residual_norm_rows",)),
    ("dequantize + GELU (inlined in int8_layer)", ("int8_layer",)),
)
TORCH_OPS = "torch operations (embeddings, pooling, copies)"
PYTHON = "Python"
UNRESOLVED = "native code without symbols"


def categorize(stack: list[str]) -> str:
    """The category of one sample: `stack` is py-spy's frames, outermost first ("name (file:line)" or an address)."""
    for frame in reversed(stack):
        name = frame.split(" (")[0]
        for category, prefixes in CATEGORIES:
            if name.startswith(prefixes):
                return category
    leaf = stack[-1] if stack else ""
    if leaf.startswith("0x"):
        return UNRESOLVED
    return PYTHON if ".py:" in leaf else TORCH_OPS


def shares(raw_lines: list[str]) -> dict[str, float]:
    """Each category's share of the samples in py-spy's raw output ("frame;frame;... count" a line)."""
    counts: Counter[str] = Counter()
    for line in raw_lines:
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        # --threads puts a "thread (id): name" frame first, --subprocesses a "process ..." one: not functions
        frames = [f for f in stack.split(";") if not f.startswith(("thread (", "process "))]
        counts[categorize(frames)] += int(count)
    total = sum(counts.values())
    return {category: count / total for category, count in counts.most_common()} if total else {}


def profile(checkpoint: Path, texts_file: Path, batch_size: int, seconds: float) -> dict:
    """{"shares": category -> share of the time, "sentences_per_s": the engine's rate while sampled}."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(py_spy).is_file():
        raise RuntimeError("py-spy is not installed (requirements/dev.txt)")
    child = subprocess.Popen([sys.executable, "-m", "bench.peak.where_time_goes", "--engine-loop",
                              "--checkpoint", str(checkpoint), "--texts", str(texts_file),
                              "--batch", str(batch_size), "--seconds", str(seconds + 4)],
                             stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        if child.stdout.readline().strip() != "ready":
            raise RuntimeError("the engine loop did not start")
        with tempfile.TemporaryDirectory() as work:
            raw = Path(work) / "samples.txt"
            subprocess.run([py_spy, "record", "--pid", str(child.pid), "--native", "--rate", "200",
                            "--duration", str(int(seconds)), "--format", "raw", "--output", str(raw)],
                           check=True, capture_output=True, timeout=seconds + 60)
            found = shares(raw.read_text().splitlines())
        rate = json.loads(child.stdout.readline())["sentences_per_s"]
    finally:
        child.kill()
        child.wait()
    return {"shares": found, "sentences_per_s": rate, "batch_size": batch_size, "threads": 1}


def engine_loop(checkpoint: Path, texts_file: Path, batch_size: int, seconds: float) -> None:
    """The child: int8 engine, one thread, whole passes over the batches; prints "ready", then its rate."""
    import torch

    from model import load_checkpoint
    from model.device import keep_freed_memory, pick_device
    from service.engine.loader import build_engine
    from service.engine.precision import choose
    from service.tasks import EncodeItem

    keep_freed_memory()
    loaded = load_checkpoint(checkpoint)
    device = pick_device("cpu")
    engine = build_engine(loaded, device, choose("int8", device))
    texts = texts_file.read_text(encoding="utf-8").splitlines()
    items = sorted((EncodeItem(e.ids, e.type_ids, pooling="mean")
                    for e in loaded.tokenizer.encode_batch(texts, truncate=True)), key=len)
    batches = [engine.collate(items[i:i + batch_size]) for i in range(0, len(items), batch_size)]
    torch.set_num_threads(1)
    engine.run(batches[0])
    print("ready", flush=True)
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        for batch in batches:
            engine.run(batch)
        done += len(items)
    print(json.dumps({"sentences_per_s": done / (time.perf_counter() - started)}), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--engine-loop", action="store_true", required=True, help="run as profile()'s child")
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--texts", type=Path, required=True, help="one sentence a line")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--seconds", type=float, default=10.0)
    arguments = parser.parse_args()
    engine_loop(arguments.checkpoint, arguments.texts, arguments.batch, arguments.seconds)
