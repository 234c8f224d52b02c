"""One admission limit over several front-end processes: each counts its requests in flight in its own
slot of a small shared file, and admits while the sum over all slots is under the limit.

Each slot has one writer (its front end), so no lock is needed; a front end that dies is restarted
in the same slot, which it zeroes, so a killed process cannot leak admissions. Two front ends that
admit at the same instant may both pass at limit - 1: the limit can be exceeded by at most the number
of front ends minus one, which is noise against its purpose (bounding the queue under a flood).
"""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np


def create_slots(path: Path, workers: int) -> None:
    """The shared file, zeroed, one int64 per front end (done once, by the supervisor)."""
    path.write_bytes(bytes(8 * workers))


class SharedInFlight:
    """`service.frontend.guards.InFlight` counted over every front end."""

    def __init__(self, path: Path, slot: int):
        with open(path, "r+b") as handle:
            self._map = mmap.mmap(handle.fileno(), 0)
        self._slots = np.frombuffer(self._map, dtype=np.int64)
        if not 0 <= slot < len(self._slots):
            raise ValueError(f"slot {slot} outside the {len(self._slots)} front ends of {path}")
        self._slot = slot
        self._slots[slot] = 0  # a restarted front end starts with nothing in flight

    def total(self) -> int:
        return int(self._slots.sum())

    def add(self, delta: int) -> None:
        self._slots[self._slot] += delta
