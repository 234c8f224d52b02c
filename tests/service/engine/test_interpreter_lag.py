"""The engine's interpreter-lag probe: it reads how late a thread gets the Python interpreter back, which is what a
runner whose batch is done on the device waits when the engine's other threads keep the interpreter busy."""

from __future__ import annotations

import statistics
import sys
import threading
import time

from service.engine.interpreter_lag import InterpreterLag


def lags_while(busy: bool, seconds: float = 0.6, switch_s: float = 0.02) -> list[float]:
    """The probe's readings over `seconds`, with (`busy`) or without a thread that runs Python the whole time; the
    switch interval raised to `switch_s`, so that a queue for the interpreter shows far above any wake-up delay."""
    lags: list[float] = []
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(1000))  # Python bytecode: the interpreter is held until the switch interval makes it let go

    previous = sys.getswitchinterval()
    sys.setswitchinterval(switch_s)
    probe = InterpreterLag(lags.append, every_s=0.005)
    spinner = threading.Thread(target=spin, daemon=True)
    try:
        if busy:
            spinner.start()
        probe.start()
        time.sleep(seconds)
    finally:
        probe.stop()
        stop.set()
        if busy:
            spinner.join()
        sys.setswitchinterval(previous)
    return lags


def test_a_thread_holding_the_interpreter_shows_as_lag():
    busy = lags_while(busy=True)
    quiet = lags_while(busy=False)
    assert len(busy) >= 5 and len(quiet) >= 20
    # Each reading waits for the busy thread to let go, up to the switch interval (20 ms here).
    assert statistics.median(busy) >= 0.008
    assert statistics.median(quiet) < 0.004 < statistics.median(busy) / 2


def test_stop_ends_the_probe():
    probe = InterpreterLag(lambda lag: None, every_s=0.05)
    probe.start()
    probe.stop(timeout=2.0)
    assert not probe._thread.is_alive()


def test_the_engine_reports_its_lag(tiny_checkpoint):
    from service.engine.models import load_models
    from service.metrics import Metrics
    from service.settings import Settings

    metrics = Metrics()
    models = load_models(Settings(checkpoint=tiny_checkpoint, device="cpu"), metrics)
    try:
        time.sleep(0.1)
        text = metrics.render().decode()
    finally:
        models.stop()
    count = next(line for line in text.splitlines() if line.startswith("bert_engine_interpreter_lag_seconds_count"))
    assert float(count.split()[-1]) >= 3  # a reading every 10 ms
    assert not models.lag._thread.is_alive()
