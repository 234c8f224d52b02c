"""Choosing the device and what the hardware computes fast: one answer for the trainer and the service."""

from __future__ import annotations

import functools
from pathlib import Path

import torch


def pick_device(choice: str, local_rank: int = 0) -> torch.device:
    """auto = the (local rank's) CUDA GPU when there is one, else the CPU; cuda without CUDA is an error.

    A CUDA device always comes back with its index ("cuda" -> the local rank's "cuda:N"):
    torch.cuda.set_device refuses a device without one."""
    device = torch.device("cuda" if choice == "auto" and torch.cuda.is_available() else
                          "cpu" if choice == "auto" else choice)
    if device.type == "cuda" and choice != "auto" and not torch.cuda.is_available():
        raise ValueError(f"device {choice} was asked for, but CUDA is not available")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", local_rank)
    return device


@functools.cache
def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bfloat16 in hardware (AVX512-BF16 or AMX). Elsewhere oneDNN emulates it,
    which is slower than float32."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux: do not guess
        return False
    return any(flag in flags.split() for flag in ("avx512_bf16", "amx_bf16"))


@functools.cache  # asked at every attention call of a bfloat16 network
def cpu_has_amx_bf16() -> bool:
    """Whether this CPU has AMX's bfloat16 tile products (Intel Sapphire Rapids and later), which torch's own CPU
    attention uses in bfloat16."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "amx_bf16" in flags.split()


def fast_half_dtype(device: torch.device) -> torch.dtype | None:
    """The half-precision type this device computes fastest, or None when float32 is fastest."""
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if cpu_has_native_bf16() else None


# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
KEEP_FREED_BYTES = 1 << 30  # free memory below this stays in the process
MMAP_ABOVE_BYTES = 1 << 25  # 32 MiB, glibc's largest mmap threshold: bigger blocks still get their own mapping


@functools.cache
def keep_freed_memory() -> bool:
    """Make glibc's malloc reuse freed blocks instead of handing them back to the kernel (Linux only).

    Eager PyTorch on CPU allocates a new output tensor for nearly every op. By default glibc serves
    blocks of a few hundred KiB and more with a fresh mmap and unmaps them on free, so every such op
    pays page faults and zero-filling on its whole output, often more than the op itself (a 1024 x 384
    float32 quantization step: 2 ms with the default, 0.2 ms without; BENCHMARKS.md). Raising the mmap
    and trim thresholds keeps freed memory for reuse, as jemalloc or tcmalloc would (PyTorch's CPU
    performance guide recommends those). The cost: the process keeps its peak memory after a burst.
    Returns whether the setting took (False off glibc)."""
    import ctypes

    try:
        libc = ctypes.CDLL(None)  # the C library the process already uses (as service/engine/threads.py does)
        return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_ABOVE_BYTES)) and bool(libc.mallopt(M_TRIM_THRESHOLD, KEEP_FREED_BYTES))
    except (OSError, AttributeError):  # no mallopt: not glibc
        return False
