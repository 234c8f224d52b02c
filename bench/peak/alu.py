"""The arithmetic peak of this CPU, measured: bench/peak/alu_peak.c's multiply-accumulate loops (register-resident,
no memory) on one core and on every core at once, one thread a core, each thread one ctypes call (ctypes lets go of
the GIL, so the calls run side by side).

The library is built by kernels/build.py's compiler driver, as the project's own kernels are, and cached beside them.
Each instruction family runs only where /proc/cpuinfo lists its flags (kernels/cpu_features.py).
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from kernels import build, cpu_features

SOURCE = "alu_peak.c"
FLAGS = ("-O3", "-Wall")  # each function names its own instruction set (target attributes)


@dataclass(frozen=True)
class Loop:
    """One of alu_peak.c's functions: the precision it counts, the CPU flags it needs, and the operations one round
    does (its accumulators x the operations of one instruction, as the C file counts them)."""

    function: str
    precision: str  # int8 | float32 | bfloat16
    instruction: str
    flags: tuple[str, ...]
    ops_per_round: int
    result: type  # the C return type, as ctypes names it


LOOPS = (
    Loop("int8_amx", "int8", "AMX tdpbssd (16x64 by 64x16 tiles)", ("amx_tile", "amx_int8"), 4 * 32768,
         ctypes.c_int64),
    Loop("int8_avx512_vnni", "int8", "AVX512-VNNI vpdpbusd zmm", ("avx512f", "avx512_vnni"), 16 * 128,
         ctypes.c_int64),
    Loop("int8_avx_vnni", "int8", "AVX-VNNI vpdpbusd ymm", ("avx2", "avx_vnni"), 12 * 64, ctypes.c_int64),
    Loop("int8_avx2_madd", "int8", "AVX2 vpmaddwd + vpaddd ymm (16-bit pairs)", ("avx2",), 12 * 32, ctypes.c_int64),
    Loop("float32_avx512_fma", "float32", "AVX-512 vfmadd zmm", ("avx512f",), 16 * 32, ctypes.c_double),
    Loop("float32_avx2_fma", "float32", "AVX2 vfmadd ymm", ("avx2", "fma"), 12 * 16, ctypes.c_double),
    Loop("bfloat16_amx", "bfloat16", "AMX tdpbf16ps (16x32 by 32x16 tiles)", ("amx_tile", "amx_bf16"), 4 * 16384,
         ctypes.c_double),
    Loop("bfloat16_avx512_dot", "bfloat16", "AVX512-BF16 vdpbf16ps zmm", ("avx512f", "avx512_bf16"), 16 * 64,
         ctypes.c_double),
)


@dataclass(frozen=True)
class AluPeak:
    precision: str
    instruction: str
    threads: int
    ops_per_s: float


def runnable_loops(amx_allowed: bool = True) -> list[Loop]:
    """The widest loop of each precision this CPU runs (LOOPS lists the wider first); AMX's only where Linux lends
    the process its tiles (`amx_allowed`)."""
    chosen: dict[str, Loop] = {}
    for loop in LOOPS:
        if "amx_tile" in loop.flags and not amx_allowed:
            continue
        if loop.precision not in chosen and all(flag in cpu_features.cpu_flags() for flag in loop.flags):
            chosen[loop.precision] = loop
    return list(chosen.values())


def usable_cores() -> int:
    """The cores this process may run on (its affinity, which a container's CPU set narrows)."""
    return len(os.sched_getaffinity(0))


class Library:
    """alu_peak.c built and loaded."""

    def __init__(self):
        self.library = ctypes.CDLL(str(build.build(SOURCE, FLAGS, sources=Path(__file__).parent)))
        # Inputs for every loop: small values, so that no float overflows or goes denormal whatever the rounds.
        self.seed = (ctypes.c_float * 64)(*[0.5 + (k % 7) / 64 for k in range(64)])

    def function(self, loop: Loop):
        function = getattr(self.library, loop.function)
        function.argtypes, function.restype = [ctypes.c_int64, ctypes.c_void_p], loop.result
        return function

    def rate(self, loop: Loop, threads: int, seconds: float) -> float:
        """Operations per second of `threads` threads each running `loop` for about `seconds`."""
        function = self.function(loop)
        rounds = self._rounds_for(function, seconds)
        start = threading.Barrier(threads + 1)
        finished: list[float] = []

        def work():
            start.wait()
            function(rounds, ctypes.addressof(self.seed))
            finished.append(time.perf_counter())

        workers = [threading.Thread(target=work) for _ in range(threads)]
        for worker in workers:
            worker.start()
        start.wait()
        started = time.perf_counter()
        for worker in workers:
            worker.join()
        # The slowest thread's end: every thread's work counts, done when the last is.
        return threads * rounds * loop.ops_per_round / (max(finished) - started)

    def _rounds_for(self, function, seconds: float) -> int:
        rounds = 1 << 16
        while True:
            started = time.perf_counter()
            function(rounds, ctypes.addressof(self.seed))
            took = time.perf_counter() - started
            if took > 0.02:
                return max(1, int(rounds * seconds / took))
            rounds *= 4


def measure(seconds: float = 0.3, repeats: int = 3, thread_counts: list[int] | None = None) -> list[AluPeak]:
    """Each precision's peak on one core and on all usable cores: the best of `repeats` timings (a noisy machine
    only ever slows a loop down)."""
    library = Library()
    counts = thread_counts or sorted({1, usable_cores()})
    found = []
    for loop in runnable_loops(amx_allowed=bool(library.library.amx_usable())):
        for threads in counts:
            best = max(library.rate(loop, threads, seconds) for _ in range(repeats))
            found.append(AluPeak(loop.precision, loop.instruction, threads, best))
    return found
