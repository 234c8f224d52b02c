"""One HTTP front-end process (`--workers N`): the HTTP app over `RemoteLink`, on the listening socket
the supervisor made, its admission count in the shared slots.

Started by `service.supervisor` (`python -m service.frontend.worker`, launch record on standard input:
the settings, each model's checkpoint resolved to a local directory (and the Hub id it came from), the directory of
the engine's sockets and its pid, the socket's file descriptor, this front end's slot).
"""

from __future__ import annotations

import sys
from pathlib import Path

from service.frontend.admission import SharedRequestCount
from service.frontend.app import create_http_app
from service.frontend.remote import RemoteLink
from service.frontend.runtime import Runtime
from service.frontend.serve import serve_http
from service.launch import die_with_parent, read_launch_record, sources_from
from service.logs import configure_logging
from service.tracing import setup as setup_tracing


def main() -> int:
    die_with_parent()
    settings, record = read_launch_record()
    slot = record["slot"]
    configure_logging(settings.log_level, settings.log_format, f"front-end-{slot}")
    link = RemoteLink(record["directory"], f"front-end-{slot}", record["engine_pid"], settings.stall_timeout_s)
    runtime = Runtime(settings, link, tracing=setup_tracing(settings, f"front-end-{slot}"))
    runtime.set_sources(sources_from(record))
    app = create_http_app(runtime, SharedRequestCount(Path(record["in_flight"]), slot, len(runtime.models)))
    failure = serve_http(app, settings, fd=record["fd"])
    return 1 if failure is not None else 0


if __name__ == "__main__":
    sys.exit(main())
