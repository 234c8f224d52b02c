"""What this CPU can run: the instruction-set extensions the kernels need, read from the flags Linux lists."""

from __future__ import annotations

import functools
import platform
from pathlib import Path


class UnsupportedCpu(Exception):
    """This machine cannot run a kernel; the message says why."""


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The flags of /proc/cpuinfo (`avx512f`, `avx512_vnni`, ...): the same on every core of a machine."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError as exc:
        raise UnsupportedCpu(f"cannot read the CPU's flags: {exc}") from None
    return frozenset(text.split())


def require(flags: tuple[str, ...]) -> None:
    """Raise UnsupportedCpu unless this is an x86-64 Linux machine whose CPU has every one of `flags`."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise UnsupportedCpu(f"the C kernels are for x86-64 Linux, not {platform.system()} {platform.machine()}")
    missing = [flag for flag in flags if flag not in cpu_flags()]
    if missing:
        raise UnsupportedCpu(f"this CPU lacks {', '.join(missing)}")
