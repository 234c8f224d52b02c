"""Run the HTTP app under uvicorn with the service's shutdown: on SIGTERM (or SIGINT), /health turns 503
and new requests are refused at once, accepted ones finish, then the process exits 0."""

from __future__ import annotations

import asyncio
import signal
import socket

import uvicorn
from fastapi import FastAPI

from service.frontend.connections import bounded_protocol
from service.frontend.fast_routes import DirectEntry
from service.memory import freeze_loaded_objects
from service.settings import Settings


def serve_http(app: FastAPI, settings: Settings, fd: int | None = None) -> Exception | None:
    """Serve until told to stop; on `fd` (a listening socket made by the supervisor) or on settings' host and
    port. Returns the exception that stopped the model from loading, if one did."""
    runtime = app.state.runtime

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            # (uvicorn's own handler re-raises the signal after shutdown, which would end us with -15.)
            runtime.lifecycle.drain()
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True
            elif settings.drain_seconds > 0:
                asyncio.get_event_loop().call_later(settings.drain_seconds, setattr, self, "should_exit", True)
            else:
                self.should_exit = True

    config = uvicorn.Config(DirectEntry(app), host=settings.host, port=settings.port, log_level=settings.log_level,
                            timeout_keep_alive=settings.keep_alive_s,
                            http=bounded_protocol(settings.header_timeout_s, settings.max_connections),
                            timeout_graceful_shutdown=max(30, settings.queue_timeout_s + 5), access_log=False,
                            # JSON logs: uvicorn's own lines go through the service's handler (service.logs), not its
                            # text formatter
                            **({"log_config": None} if settings.log_format == "json" else {}))
    # The supervisor's listening socket, taken as what it is. (uvicorn's own `fd=` takes any descriptor for a
    # Unix socket; the event loop then leaves TCP_NODELAY off on the connections it accepts, and every answer
    # written in two parts waited for the client's delayed ACK: 44 ms per request, on any hardware.)
    sockets = [socket.socket(fileno=fd)] if fd is not None else None
    server = Server(config)
    failed: list[Exception] = []

    def stop_on_failure(exc: Exception) -> None:
        failed.append(exc)
        server.should_exit = True

    app.state.on_load_failure = stop_on_failure
    app.state.on_loaded = freeze_loaded_objects  # with --workers 0, the engine's objects too
    server.run(sockets=sockets)
    return failed[0] if failed else None
