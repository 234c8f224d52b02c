"""How long the engine's threads wait for the Python interpreter: the sign that its host work, not the device, sets
the pace.

Every thread of the engine runs its Python under one lock (the GIL): the main thread reading requests off the socket,
each model's preparer choosing and collating batches, the runners launching them and building their results. On a
CPU the device's work is most of a batch and runs with the lock released; on a GPU the device finishes a small model's
batch in a fraction of a millisecond and the host work around it is the batch. Once those threads' Python adds up to
one core, each waits for the others at every turn (a runner whose batch is done on the device waits for the lock
before it can read it), the device idles, and neither the device's busy share nor any one thread's CPU says why.

A probe thread asks for the lock every PROBE_S and records how late it gets it (`bert_engine_interpreter_lag_seconds`):
about 0.1 ms (the operating system's wake-up and timer slack) while the interpreter has time to spare; up to the switch
interval (5 ms: `sys.getswitchinterval()`, after which a waiting thread makes the holder let go) when the threads
queue for it. In the one-process server (`--workers 0`) the HTTP event loop shares the interpreter, and the figure
counts its work too. The probe's own cost: one wake-up per PROBE_S, a few microseconds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

PROBE_S = 0.01


class InterpreterLag:
    """A daemon thread that sleeps `every_s` at a time and hands `observe` how late each sleep ended (seconds)."""

    def __init__(self, observe: Callable[[float], None], every_s: float = PROBE_S):
        self.observe = observe
        self.every_s = every_s
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._probe, name="bert-lag-probe", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 1.0) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _probe(self) -> None:
        while True:
            asked = time.perf_counter()
            # The wait releases the interpreter; returning needs it back, which is what is timed.
            if self._stopping.wait(self.every_s):
                return
            self.observe(max(0.0, time.perf_counter() - asked - self.every_s))
