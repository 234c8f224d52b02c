"""The supervisor's private directory (`bert-serve-*` in the temporary directory): the engine's sockets, the
admission slots, the metrics files.

A supervisor removes its own at exit, which one killed with SIGKILL cannot do; so each start removes what dead
ones left. A directory belongs to a dead supervisor when the owner file written at its creation names a
process that is gone, or a pid now held by another process (one started at another time: pids are reused).
A live server's directory, another user's, or one without an owner file (being created this instant, or made
by a version that wrote none) is left alone.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger("service")
PREFIX = "bert-serve-"
OWNER_FILE = "owner"  # "<pid> <start time>" of the supervisor that made the directory


def process_identity(pid: int) -> str | None:
    """"<pid> <start time in clock ticks since boot>" of a running process (Linux), "<pid>" where /proc is
    missing; None when no such process runs (or it has ended and awaits its parent)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        if Path("/proc/self/stat").exists():
            return None  # Linux, and no such process
        return str(pid) if _signal_reaches(pid) else None
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else f"{pid} {fields[19]}"  # state, ..., starttime (field 22 of stat)


def _signal_reaches(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    return True


def create_work_directory(parent: Path | None = None) -> Path:
    directory = Path(tempfile.mkdtemp(prefix=PREFIX, dir=parent))
    (directory / OWNER_FILE).write_text(process_identity(os.getpid()) or str(os.getpid()))
    return directory


def remove_abandoned(parent: Path | None = None) -> list[Path]:
    """Remove the directories of supervisors that are gone; returns them."""
    removed = []
    for candidate in Path(parent or tempfile.gettempdir()).glob(PREFIX + "*"):
        try:
            if candidate.is_symlink() or not candidate.is_dir() or candidate.stat().st_uid != os.getuid():
                continue
            owner = (candidate / OWNER_FILE).read_text().strip()
            pid = int(owner.split()[0])
        except (OSError, ValueError, IndexError):
            continue  # no readable owner: not known to be abandoned
        if process_identity(pid) == owner:
            continue  # its supervisor still runs
        shutil.rmtree(candidate, ignore_errors=True)
        log.info("removed %s, left by a server that is gone (pid %d)", candidate.name, pid)
        removed.append(candidate)
    return removed
