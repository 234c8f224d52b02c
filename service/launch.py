"""How the supervisor hands a child process (the engine, a front end) what it needs, and ties the
child's life to its own.

The launch record travels as JSON on the child's standard input, never in its environment or
command line, because it holds the settings and so the API key (which `--api-key-file` keeps out of
the environment on purpose).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
from typing import Any

from service.settings import Settings

PR_SET_PDEATHSIG = 1


def launch_record(settings: Settings, **fields: Any) -> bytes:
    """The record for one child: the settings (the key itself, not its file, which was read once) and `fields`."""
    values = settings.model_dump(mode="json", exclude={"api_key_file"})
    return json.dumps({"settings": values, **fields}).encode()


def read_launch_record() -> tuple[Settings, dict[str, Any]]:
    """In the child: the settings and the other fields the supervisor wrote on standard input."""
    record = json.loads(sys.stdin.buffer.read())
    sys.stdin.close()
    return Settings(**record.pop("settings")), record


def sources_from(record: dict[str, Any]) -> dict:
    """Each model's resolved checkpoint (name -> model.hub.ResolvedCheckpoint), as the supervisor wrote them."""
    from pathlib import Path

    from model.hub import ResolvedCheckpoint

    return {name: ResolvedCheckpoint(Path(found["path"]), found["hub_id"], found["revision"], found["commit"])
            for name, found in record["sources"].items()}


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Have the kernel send `sig` to this process when the supervisor dies (Linux), so that a killed
    supervisor leaves no engine holding the GPU and no front end holding the port."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        return  # not Linux: the child outlives a killed supervisor
    if os.getppid() != parent:  # the supervisor died before the request was made
        os.kill(os.getpid(), sig)
