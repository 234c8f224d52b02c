"""The files of a checkpoint directory: reading its small JSON files, with errors that name the file, and flushing a
folder's entries to disk once a file in it is renamed into place."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def read_json_object(path: Path, error: type[Exception], missing_ok: bool = True) -> dict[str, Any]:
    """The JSON object in `path` ({} when it is absent and `missing_ok`); anything else raises `error`."""
    if missing_ok and not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise error(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise error(f"{path}: expected a JSON object")
    return value


def fsync_directory(directory: Path) -> None:
    """Flush `directory`'s own entries to disk: a rename into it is durable only once this returns."""
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
