"""Loading a built C kernel (`kernels.build`) through ctypes, once, at first use, checked against torch.

ctypes lets go of the GIL during each call, as torch's own kernels do. Every kernel needs some CPU features (its
intrinsics); where they, the compiler or a build are missing, or a kernel's results differ from what it must
compute, `FirstUse` gives None with the reason, and the caller keeps its torch path.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from kernels import build, cpu_features

log = logging.getLogger("kernels")


class KernelUnavailable(Exception):
    """A kernel cannot run here; the message says why."""


def load(source_name: str) -> ctypes.CDLL:
    """The library built from `kernels/c/<source_name>` (one of build.KERNELS), on a CPU with the flags it needs."""
    flags, cpu_flags = build.KERNELS[source_name]
    try:
        cpu_features.require(cpu_flags)
        library = ctypes.CDLL(str(build.build(source_name)))
    except (cpu_features.UnsupportedCpu, build.BuildFailed) as exc:
        raise KernelUnavailable(str(exc)) from None
    except OSError as exc:
        raise KernelUnavailable(f"{source_name} did not load: {exc}") from None
    runtimes = openmp_runtimes()
    if "-fopenmp" in flags and len(runtimes) > 1:
        # Its threads would spin against torch's on the same cores; torch's kernels serve instead.
        raise KernelUnavailable(f"{source_name} loaded an OpenMP runtime other than torch's: {', '.join(runtimes)}")
    return library


def openmp_runtimes() -> list[str]:
    """The OpenMP runtime libraries mapped into this process (torch's; a kernel built with -fopenmp must find that
    same one: torch loads its libgomp.so.1 into the global namespace, where the kernel's libgomp.so.1 resolves)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return []
    return sorted({line.split()[-1] for line in maps.splitlines() if "libgomp" in line or "libiomp" in line})


class FirstUse:
    """A kernel built, loaded and checked at the first call, once: `make` wraps the library, `check` raises
    KernelUnavailable where its results differ from what it must compute. Calling it gives the wrapper, or None
    where the kernel cannot run; `why_not()` then says why (and `fallback`, what runs instead, is logged with it).

    Any other exception from the wrapper or the check (a fault in this package, not the CPU's) is taken the same
    way, logged as a warning with its traceback: the process keeps serving on the torch path, and the kernels' tests,
    which accept only the reasons a CPU or a machine gives (test_build_and_load.py), fail on it.

    A check must leave the process as it found it: its own torch.Generator, never the global seed, and thread counts
    passed to the kernel rather than set on torch."""

    def __init__(self, source_name: str, make: Callable, check: Callable, fallback: str):
        self.source_name, self.make, self.check, self.fallback = source_name, make, check, fallback
        self.asked, self.checking, self.kernel, self.reason = False, False, None, None
        # Another thread's first call waits for the build and check; a call from within the check itself (which
        # may build layers that ask for this kernel) gets None.
        self.lock = threading.RLock()

    def __call__(self):
        if self.asked:
            return self.kernel
        with self.lock:
            if self.asked or self.checking:
                return self.kernel
            self.checking = True
            try:
                candidate = self.make(load(self.source_name))
                self.check(candidate)
                self.kernel = candidate
            except KernelUnavailable as exc:
                self.reason = str(exc)
                log.info("%s (%s)", self.fallback, exc)
            except Exception as exc:  # noqa: BLE001 - a fault in a wrapper or its check: the torch path still serves
                self.reason = f"its first-use check failed: {type(exc).__name__}: {exc}"
                log.warning("%s (%s)", self.fallback, self.reason, exc_info=True)
            finally:
                self.checking, self.asked = False, True
        return self.kernel

    def why_not(self) -> str | None:
        """Why the kernel is None, once it has been asked for; None while it is available or not yet asked."""
        return self.reason


def ask_for_amx(library: ctypes.CDLL) -> None:
    """Ask Linux (5.16 and later) to let this process use AMX's tile registers, through the `amx_request` every AMX
    library has (kernels/c/amx_tiles.c); refused, the kernel cannot run."""
    library.amx_request.argtypes, library.amx_request.restype = [], ctypes.c_int
    refusal = library.amx_request()
    if refusal:
        raise KernelUnavailable(f"Linux did not let this process use AMX's tiles: {os.strerror(refusal)}")


class FirstOf:
    """The first of several kernels for one job that runs here (a CPU's best instruction set first), each asked for
    in order at the first call; `why_not` joins their reasons where none runs."""

    def __init__(self, *choices: FirstUse):
        self.choices = choices

    def __call__(self):
        return next((found for found in (choice() for choice in self.choices) if found is not None), None)

    def why_not(self) -> str | None:
        if self() is not None:
            return None
        return "; ".join(f"{choice.source_name}: {choice.why_not()}" for choice in self.choices)
