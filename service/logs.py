"""The server's log lines: text (the default) or one JSON object a line (`--log-format json`), for every process.

A JSON line has `time` (UTC, ISO 8601), `level`, `message`, `logger` and `process` (`server`, `engine`,
`front-end-N`); a line written while a request is handled also has that request's `request_id`, `trace_id`
(when the request carries or starts a trace), `route` and, on the request's own line (`--log-requests`),
`status` and `duration_ms`. The request a line belongs to is found through `CURRENT_REQUEST`, a context
variable the front ends set per request (`service.frontend.request_record`): any log call made while a request
is handled carries its ids without being passed them.
"""

from __future__ import annotations

import logging
import sys
from contextvars import ContextVar
from datetime import datetime, timezone

import orjson

# The request being handled in this task: anything with `log_fields() -> dict`, or None.
CURRENT_REQUEST: ContextVar = ContextVar("bert_request", default=None)
REQUEST_KEYS = ("request_id", "trace_id", "route", "status", "duration_ms")


class JsonLines(logging.Formatter):
    def __init__(self, process: str):
        super().__init__()
        self.process = process

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname, "message": record.getMessage(), "logger": record.name, "process": self.process,
        }
        request = CURRENT_REQUEST.get()
        if request is not None:
            entry.update(request.log_fields())
        for key in REQUEST_KEYS:  # given with the call (`extra=`): the request's own line
            if key in record.__dict__:
                entry[key] = record.__dict__[key]
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


def configure_logging(level: str, log_format: str = "text", process: str | None = None) -> None:
    """The root logger's one handler on standard error. `process` names the process in each line (the text format
    of the one-process server names the logger instead, as before)."""
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonLines(process or "server"))
    else:
        who = process or "%(name)s"
        handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s {who}: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    logging.getLogger("httpx2").setLevel(logging.WARNING)  # one line per Hub request; model.hub logs the progress
