"""Operating-system details of the compute threads (Linux): their names and their priority."""

from __future__ import annotations

import ctypes
import logging
import os
import threading

log = logging.getLogger("service")
PR_SET_NAME = 15


def name_os_thread() -> None:
    """Give the calling thread its Python name at the OS level too (Linux, 15 characters), so that
    `top -H`, py-spy and /proc show which thread is the preparer and which are the runners."""
    name = threading.current_thread().name
    try:
        libc = ctypes.CDLL(None)
        libc.prctl(PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the names are only cosmetic
        pass


def lower_thread_priority(niceness: int) -> None:
    """Raise the calling thread's nice value to `niceness` (Linux schedules threads one by one).

    Compute threads run at a lower priority than the thread that accepts and refuses requests: under
    a flood the event loop still gets the CPU it needs to answer 429 at once, while the device threads
    lose only the little time that takes.
    """
    if niceness <= 0 or not hasattr(os, "setpriority"):
        return
    try:
        thread_id = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, thread_id, max(niceness, os.getpriority(os.PRIO_PROCESS, thread_id)))
    except OSError as exc:  # not permitted here: run at the normal priority
        log.warning("cannot lower the compute threads' priority: %s", exc)
