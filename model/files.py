"""Reading the small JSON files of a checkpoint directory, with errors that name the file."""

from __future__ import annotations

import json
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
