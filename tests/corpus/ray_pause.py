"""For the test of a killed embedding actor: a Ray worker setup hook (runtime_env's `worker_process_setup_hook`,
set by the test's own ray.init) that makes the first embedding actor to reach its second unit write its process id
to the file $CORPUS_TEST_ACTOR_MARKER and stand still there, to be killed; the actor Ray restarts in its place sees
the file and goes on. The job itself has no such hook."""

from __future__ import annotations

import os
import time
from pathlib import Path

MARKER_VARIABLE = "CORPUS_TEST_ACTOR_MARKER"
STOP_AT_UNIT = 2


def install() -> None:
    marker = os.environ.get(MARKER_VARIABLE)
    if not marker:
        return
    from corpus import ray_job

    embed_unit = ray_job._EmbedUnit.__call__
    calls = [0]

    def standing_still_once(self, batch: dict) -> dict:
        calls[0] += 1
        if calls[0] == STOP_AT_UNIT:
            _claim_and_stand_still(Path(marker))
        return embed_unit(self, batch)

    ray_job._EmbedUnit.__call__ = standing_still_once


def _claim_and_stand_still(marker: Path) -> None:
    """Only the first actor to get here stands still: the marker is made by an atomic link."""
    if marker.exists():
        return
    claimed = marker.with_name(f"{marker.name}.{os.getpid()}")
    claimed.write_text(str(os.getpid()), encoding="utf-8")
    try:
        os.link(claimed, marker)
    except FileExistsError:
        return
    finally:
        claimed.unlink()
    while True:
        time.sleep(60)
