"""`python -m tests.corpus.paused_job POINT MARKER ARGS...`: `python -m corpus ARGS` that stands still at POINT, so
that the tests of resume can kill it there (SIGKILL) and run the same command again. Only the tests start the job
this way: the job itself has no such hook.

POINT is one of
    plan            the manifest written, no shard yet
    batches:N       N engine batches computed
    committing:N    the Nth shard written whole but not committed (a `.tmp-` file not renamed yet, or an object
                    store's shard without its commit record)
    shards:N        N shards committed
At POINT the job writes POINT into the file MARKER and sleeps until it is killed.
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from pathlib import Path


def _stand_still(marker: str, point: str) -> None:
    Path(marker).write_text(point + "\n", encoding="utf-8")
    while True:
        time.sleep(60)


def _counted(function, wanted: int, stop, before: bool):
    """`function` that calls `stop()` at its `wanted`th call (before it runs, or after it returned)."""
    calls, lock = [0], threading.Lock()

    @functools.wraps(function)
    def counted(*args, **kwargs):
        with lock:
            calls[0] += 1
            reached = calls[0] == wanted
        if reached and before:
            stop()
        result = function(*args, **kwargs)
        if reached and not before:
            stop()
        return result
    return counted


def install(point: str, marker: str) -> None:
    from corpus import local_job
    from corpus.local_output import LocalOutput
    from corpus.progress import Progress
    from corpus.store_output import StoreOutput

    name, _, number = point.partition(":")
    wanted = int(number or 1)
    stop = functools.partial(_stand_still, marker, point)
    if name == "plan":
        local_job.start_job = _counted(local_job.start_job, 1, stop, before=False)
    elif name == "batches":
        Progress.computed = _counted(Progress.computed, wanted, stop, before=False)
    elif name == "committing":
        LocalOutput.commit = _counted(LocalOutput.commit, wanted, stop, before=True)
        StoreOutput.commit = _counted(StoreOutput.commit, wanted, stop, before=True)
    elif name == "shards":
        Progress.written = _counted(Progress.written, wanted, stop, before=False)
    else:
        raise SystemExit(f"unknown point {point!r}")


if __name__ == "__main__":
    point, marker, *args = sys.argv[1:]
    install(point, marker)
    from corpus.cli import main

    sys.exit(main(args))
