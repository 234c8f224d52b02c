"""`EngineLink` to the engine process: ZeroMQ sockets carrying `service.messages`.

Each request is one Submit with an id of this front end; its Done or Failed resolves the future the
front door awaits. The Submits of one pass of the event loop leave as one message, and the engine
answers each finished batch with one message per front end. The link also watches the engine's process: the moment it ends, every request in
flight fails with 503 (no client waits out its deadline on a dead engine) and `failure()` turns
/live to 503, so the orchestrator restarts the server. A live engine that is stuck does the same to
`failure()` (not to the requests in flight, which the front door answers at their deadline): its
Heartbeat says it has had work and finished nothing for `stall_timeout_s`, or no Heartbeat has come
for that long (a stopped or hung process). Once it moves again, `failure()` clears.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import zmq

from service.errors import ServiceError
from service.messages import (
    EVERYONE,
    Cancel,
    Done,
    Failed,
    Heartbeat,
    Hello,
    ModelFacts,
    Receiver,
    Status,
    Submit,
    decode,
    encode,
    endpoints,
    heartbeat_every,
    new_socket,
    topic,
)
from service.tasks import Item

log = logging.getLogger("service")
ENGINE_STOPPED = "the engine process stopped"
PROCESS_POLL_S = 0.2  # where pidfd is not available
HELLO_EVERY_S = 0.1  # until the engine answers: a SUB socket hears nothing sent before it has subscribed


@dataclass
class RemotePending:
    result: asyncio.Future
    request_id: int
    link: RemoteLink
    done: Done | None = None  # the engine's answer (its timing), once it came

    def cancel(self) -> None:
        if self.link.pending.pop(self.request_id, None) is not None:
            self.link.send(Cancel(self.request_id))

    def timing(self) -> tuple[float, float, list[str] | None]:
        done = self.done
        return (done.started, done.inference_s, done.batch_spans) if done is not None else (0.0, 0.0, None)


class RemoteLink:
    def __init__(self, directory: str, identity: str, engine_pid: int | None = None, stall_timeout_s: float = 15.0):
        self.directory = directory
        self.identity = identity.encode()
        self.engine_pid = engine_pid
        self.stall_timeout_s = stall_timeout_s
        self._heartbeat = Heartbeat(0.0)  # the last one heard
        self._heartbeat_at: float | None = None  # when (time.monotonic()); None until the engine is ready
        self.detail = "waiting for the engine process"
        self.pending: dict[int, RemotePending] = {}
        self._ids = itertools.count()
        self._failure: str | None = None
        self._status: asyncio.Future | None = None  # the first ready/failed Status
        self._loading = asyncio.Event()  # heard that the engine is still loading
        self._heard = False  # whether any Status has arrived (the subscription works)
        self._outgoing: list[bytes] = []  # messages of this pass of the event loop, sent together

    async def start(self, directories: dict[str, Path]) -> list[ModelFacts]:
        """`directories` are the engine process's already (the supervisor resolved them for both)."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        inbox_address, outbox_address = endpoints(self.directory)
        self._context = zmq.Context()
        self._push = new_socket(self._context, zmq.PUSH)
        self._push.connect(inbox_address)
        replies = new_socket(self._context, zmq.SUB)
        replies.setsockopt(zmq.SUBSCRIBE, topic(self.identity))
        replies.setsockopt(zmq.SUBSCRIBE, EVERYONE)
        replies.connect(outbox_address)
        self._status = loop.create_future()
        self._receiver = Receiver(replies, self._receive, loop)
        if self.engine_pid is not None:
            self._watch_engine(loop)
        while not self._status.done():
            if not self._heard:  # once subscribed, every change of the engine's state reaches this front end
                self.send(Hello(worker=os.getpid()))
            await asyncio.wait([self._status], timeout=HELLO_EVERY_S)
        status: Status = self._status.result()
        if status.state != "ready":
            raise RuntimeError(status.detail or f"the engine is {status.state}")
        return status.models

    async def loading(self) -> None:
        await self._loading.wait()

    def submit(self, items: list[Item], deadline: float, model: str = "", trace: str | None = None) -> RemotePending:
        failure = self.failure()
        if failure is not None:
            raise ServiceError("unavailable", failure, retry_after_s=None if self._failure else 5)
        request_id = next(self._ids)
        pending = RemotePending(asyncio.get_running_loop().create_future(), request_id, self)
        self.pending[request_id] = pending
        self.send(Submit(request_id, items, deadline, trace=trace, model=model))
        return pending

    def send(self, message) -> None:
        if not self._outgoing:
            self._loop.call_soon(self._flush)
        self._outgoing.append(encode(message))

    def _flush(self) -> None:
        frames, self._outgoing = self._outgoing, []
        self._push.send_multipart([self.identity, *frames], flags=zmq.NOBLOCK)
        self._receiver.drain()  # a send can swallow the edge that says replies are waiting

    def failure(self) -> str | None:
        if self._failure is not None or self._heartbeat_at is None:
            return self._failure
        silent = time.monotonic() - self._heartbeat_at
        if silent > self.stall_timeout_s:
            return f"the engine process has sent no heartbeat for {silent:.0f} s (stopped or hung); restart the server"
        return self._heartbeat.problem(self.stall_timeout_s)

    def computing(self) -> bool:
        """Heard within a few heartbeats, and not stuck: a request past its deadline is then on the device."""
        if self.failure() is not None or self._heartbeat_at is None:
            return False
        return time.monotonic() - self._heartbeat_at <= 4 * heartbeat_every(self.stall_timeout_s)

    async def stop(self) -> None:
        """The engine is the supervisor's to stop; the front end only lets go of it."""
        if self._status is not None:
            self._receiver.close()
            self._push.close(linger=0)
            self._context.term()

    # ---- what the engine says -------------------------------------------------------------------

    def _receive(self, frames: list[bytes]) -> None:
        for frame in frames[1:]:  # frames[0] is the topic
            message = decode(frame)
            if isinstance(message, Done):
                self._settle(message.request_id, message.results, None, message)
            elif isinstance(message, Failed):
                self._settle(message.request_id, None,
                             ServiceError(message.kind, message.message, retry_after_s=message.retry_after_s))
            elif isinstance(message, Heartbeat):
                self._heartbeat, self._heartbeat_at = message, time.monotonic()
            elif isinstance(message, Status):
                self._on_status(message)

    def _settle(self, request_id: int, results, error: ServiceError | None, done: Done | None = None) -> None:
        pending = self.pending.pop(request_id, None)
        if pending is None or pending.result.done():  # cancelled: its client left
            return
        if error is not None:
            pending.result.set_exception(error)
        else:
            pending.done = done
            pending.result.set_result(results)

    def _on_status(self, status: Status) -> None:
        self._heard = True
        self.detail = status.detail
        if status.state == "loading":
            self._loading.set()
        if status.state == "failed":
            self._failure = f"the model failed to load: {status.detail}"
        if status.state == "ready" and self._heartbeat_at is None:
            self._heartbeat_at = time.monotonic()  # heartbeats come from now on
        if status.state in ("ready", "failed") and not self._status.done():
            self._status.set_result(status)

    # ---- the engine's process -------------------------------------------------------------------

    def _watch_engine(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            handle = os.pidfd_open(self.engine_pid)
        except (AttributeError, OSError):  # no pidfd (old kernel, other OS): poll
            loop.create_task(self._poll_engine())
            return
        loop.add_reader(handle, self._engine_stopped, loop, handle)

    async def _poll_engine(self) -> None:
        while _running(self.engine_pid):
            await asyncio.sleep(PROCESS_POLL_S)
        self._engine_stopped()

    def _engine_stopped(self, loop: asyncio.AbstractEventLoop | None = None, handle: int | None = None) -> None:
        if handle is not None:
            loop.remove_reader(handle)
            os.close(handle)
        if self._failure is None:
            self._failure = ENGINE_STOPPED
            log.error("%s: failing %d requests in flight", ENGINE_STOPPED, len(self.pending))
        for request_id in list(self.pending):
            self._settle(request_id, None, ServiceError("unavailable", ENGINE_STOPPED, retry_after_s=5))
        if self._status is not None and not self._status.done():
            self._status.set_result(Status("failed", self._failure))


def _running(pid: int) -> bool:
    """Whether `pid` is a process that has not ended (a zombie, ended but not yet reaped, has)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
