"""The engine in the HTTP process itself (`--workers 0`, and the tests): items go straight into the batcher.

The engine process (`service.engine.server`) queues into the same batcher with a sink of its own (its
socket back to the front ends), so both arrangements queue, cancel and fail requests the same way.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from service.engine.batcher import Batcher, Ticket
from service.engine.long_inputs import folder
from service.engine.models import EngineModels, load_models
from service.errors import ServiceError
from service.messages import Heartbeat, ModelFacts
from service.metrics import Metrics
from service.settings import Settings
from service.tasks import Item


@dataclass
class LocalPending:
    result: asyncio.Future
    ticket: Ticket
    batcher: Batcher

    def cancel(self) -> None:
        self.batcher.cancel(self.ticket)  # the request's entries that have not run are dropped

    def timing(self) -> tuple[float, float, list[str] | None]:
        return self.ticket.started, self.ticket.inference_s, self.ticket.batch_spans


class LoopSink:
    """Hands finished requests to the event loop that waits for them: one wake-up per batch."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop

    def deliver(self, tickets: list[Ticket]) -> None:
        self.loop.call_soon_threadsafe(_settle, tickets)


def _settle(tickets: list[Ticket]) -> None:
    for ticket in tickets:
        future: asyncio.Future = ticket.tag
        if future.done():  # cancelled: its client left
            continue
        if ticket.error is not None:
            future.set_exception(ticket.error)
        else:
            future.set_result(ticket.results)


def submit(batcher: Batcher, sink: LoopSink, items: list[Item], deadline: float, trace: str | None = None
           ) -> LocalPending:
    """Queue a request's items; when one of them fails, the rest of the request is not computed."""
    ticket = Ticket(deadline, len(items), sink, tag=sink.loop.create_future(), trace=trace, finish=folder(items))
    batcher.submit(items, ticket)
    return LocalPending(ticket.tag, ticket, batcher)


class LocalLink:
    """`service.frontend.link.EngineLink` for an engine in this process."""

    def __init__(self, settings: Settings, metrics: Metrics, engine_factory=None):
        self.settings = settings
        self.metrics = metrics
        self.engine_factory = engine_factory
        self.models: EngineModels | None = None
        self.detail = "loading the model"

    async def start(self, directories: dict[str, Path]) -> list[ModelFacts]:
        self.models = await asyncio.to_thread(load_models, self.settings, self.metrics, directories,
                                              self.engine_factory)
        self.sink = LoopSink(asyncio.get_running_loop())
        return self.models.facts

    async def loading(self) -> None:
        return  # the engine is this process's, and it loads in `start`

    def submit(self, items: list[Item], deadline: float, model: str = "", trace: str | None = None) -> LocalPending:
        failure = self.failure()
        if failure is not None:  # stuck: waiting would only end at the deadline
            raise ServiceError("unavailable", failure, retry_after_s=5)
        batcher = self.models.batcher(model)
        if batcher is None:
            raise ServiceError("not_found", f"no model is named {model!r} here")
        return submit(batcher, self.sink, items, deadline, trace)

    def failure(self) -> str | None:
        """A dead batching thread, or one stuck (the heartbeat the engine process sends, read here directly)."""
        if self.models is None:
            return None
        if not self.models.workers_alive:
            return "a batching thread has died; restart the server"
        return Heartbeat(self.models.stalled_for()).problem(self.settings.stall_timeout_s)

    def computing(self) -> bool:
        return self.failure() is None

    async def stop(self) -> None:
        if self.models is not None:
            await asyncio.to_thread(self.models.stop)
