"""`create_app(settings) -> FastAPI`: the whole service in one process (`--workers 0`, and the tests).

The HTTP side (`service.frontend`) over an engine in this same process (`service.engine.link`). With
`--workers N` the same HTTP app runs in N processes instead, each over the engine process
(`service.supervisor`).
"""

from __future__ import annotations

from fastapi import FastAPI

from service.engine.link import LocalLink
from service.frontend.app import create_http_app
from service.frontend.runtime import Runtime
from service.metrics import Metrics
from service.settings import Settings
from service.tracing import setup as setup_tracing


def create_app(settings: Settings | None = None, engine_factory=None) -> FastAPI:
    """The service as an ASGI app. `engine_factory(model, device, dtype)` replaces the engine (tests
    inject faults through it)."""
    settings = settings or Settings()
    metrics = Metrics()
    tracing = setup_tracing(settings, "server")
    return create_http_app(Runtime(settings, LocalLink(settings, metrics, engine_factory), metrics, tracing))
