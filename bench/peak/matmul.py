"""The matrix-product peak torch reaches on this CPU: large square products (torch.matmul in float32 and bfloat16,
torch._int_mm in int8), on one core and on all usable cores. What a well-tuned library gets from the arithmetic
that bench/peak/alu.py measures bare. bfloat16 only where the CPU computes it natively (AVX512-BF16 or AMX,
model.device.cpu_has_native_bf16): elsewhere oneDNN emulates it, and its figure would be no peak."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from model.device import cpu_has_native_bf16


@dataclass(frozen=True)
class MatmulPeak:
    precision: str
    size: int  # the square matrices' side
    threads: int
    ops_per_s: float


def precisions() -> list[str]:
    return ["int8", "float32"] + (["bfloat16"] if cpu_has_native_bf16() else [])


def product_rate(precision: str, size: int, seconds: float) -> float:
    """Operations per second (a multiply and an add = 2) of (size x size) @ (size x size) in `precision`."""
    generator = torch.Generator().manual_seed(0)
    if precision == "int8":
        a = torch.randint(-127, 128, (size, size), dtype=torch.int8, generator=generator)
        b = torch.randint(-127, 128, (size, size), dtype=torch.int8, generator=generator)
        run = lambda: torch._int_mm(a, b)  # noqa: E731
    else:
        dtype = getattr(torch, precision)
        a = torch.randn(size, size, generator=generator).to(dtype)
        b = torch.randn(size, size, generator=generator).to(dtype)
        run = lambda: torch.matmul(a, b)  # noqa: E731
    run()  # oneDNN's first call packs and plans
    calls, started = 0, time.perf_counter()
    while calls < 3 or time.perf_counter() - started < seconds:
        run()
        calls += 1
    return calls * 2 * size**3 / (time.perf_counter() - started)


def measure(thread_counts: list[int], size: int = 2048, seconds: float = 0.5, repeats: int = 3) -> list[MatmulPeak]:
    """Each precision's best of `repeats` timings at each thread count; torch's thread count is given back."""
    threads_before = torch.get_num_threads()
    found = []
    try:
        for precision in precisions():
            for threads in thread_counts:
                torch.set_num_threads(threads)
                best = max(product_rate(precision, size, seconds) for _ in range(repeats))
                found.append(MatmulPeak(precision, size, threads, best))
    finally:
        torch.set_num_threads(threads_before)
    return found
