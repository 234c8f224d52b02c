"""What the HTTP side needs of an engine, whichever process it runs in.

Two links implement it: `service.engine.link.LocalLink` (the engine in this process: `--workers 0`,
and the tests) and `service.frontend.remote.RemoteLink` (the engine process, over ZeroMQ). The front
door and the routes see only this interface and the types of `service.messages`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Protocol

from service.messages import ModelFacts
from service.tasks import Item


class Pending(Protocol):
    """One request's items on their way through the engine."""

    result: asyncio.Future  # resolves to list[Result] in item order, or raises ServiceError

    def cancel(self) -> None:
        """Drop whatever of the request has not run yet (its client left, or one of its items failed)."""

    def timing(self) -> tuple[float, float, list[str] | None]:
        """Once `result` is set: when its first batch began (time.monotonic(); 0 if none ran), the device time of its
        batches, and their spans' traceparents (when the request was submitted with a trace)."""


class EngineLink(Protocol):
    detail: str  # what loading is doing now, for /health's 503 while loading

    async def start(self, directories: dict[str, Path]) -> list[ModelFacts]:
        """Return every model's facts (the default first) once the engine is ready to compute them (`directories`:
        each model's name and local directory); raise RuntimeError (with the reason) if it cannot be."""

    async def loading(self) -> None:
        """Return once the engine is known to be still loading (never, if it turns out ready). Until the link
        knows either, the HTTP server takes no connections: a front end that answered 503 while the engine and
        the other front ends serve would fail requests that a moment later would succeed."""

    def submit(self, items: list[Item], deadline: float, model: str = "", trace: str | None = None) -> Pending:
        """Queue `items` for the model `model` ("" = the default) to reach the device by `deadline`
        (time.monotonic()); raise ServiceError to refuse them. `trace`: the request span's W3C traceparent, when
        the request is traced (its batches' spans link to it)."""

    def failure(self) -> str | None:
        """Why the engine cannot compute (a dead thread or process, or one stuck for stall_timeout_s), or None."""

    def computing(self) -> bool:
        """Whether the engine is alive and moving now: a request past its queue deadline and still unanswered is
        then on the device (an engine that moves answers late requests itself), and worth waiting for."""

    async def stop(self) -> None:
        """Compute everything accepted, then stop."""
