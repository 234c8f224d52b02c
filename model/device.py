"""Choosing the device and what the hardware computes fast: one answer for the trainer and the service."""

from __future__ import annotations

import functools
from pathlib import Path

import torch


def pick_device(choice: str, local_rank: int = 0) -> torch.device:
    """auto = the (local rank's) CUDA GPU when there is one, else the CPU; cuda without CUDA is an error."""
    if choice == "auto":
        return torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(choice)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {choice} was asked for, but CUDA is not available")
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


def fast_half_dtype(device: torch.device) -> torch.dtype | None:
    """The half-precision type this device computes fastest, or None when float32 is fastest."""
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if cpu_has_native_bf16() else None
