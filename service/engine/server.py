"""The engine process (`--workers N`): the one owner of the device, the model and the batcher.

Front ends PUSH `service.messages` (Hello, Submit, Cancel) to its PULL socket and hear back on their
own topic of its PUB socket (Status, Done, Failed; a Heartbeat goes to all a few times a second). A Submit
goes into the batcher exactly as in the one-process server; when a batch finishes requests, the runner
thread that ran it sends them to each front end as one message (`Replies`). No event loop: this process's
main thread only reads the socket, queues and sends the heartbeat, so it takes little of the GIL from the
threads that feed the device.

Loading runs in a thread while the socket already answers Hello with the loading Status, so the front
ends can say what is happening on /health. Started by `service.supervisor` (`python -m
service.engine.server`, launch record on standard input). SIGTERM finishes what is queued, answers it,
and exits 0; a model that fails to load exits 1 after telling the front ends why.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time

import zmq

from service.engine.batcher import Batcher, Ticket
from service.engine.long_inputs import folder
from service.engine.models import EngineModels, load_models
from service.errors import ServiceError
from service.launch import die_with_parent, read_launch_record, sources_from
from service.logs import configure_logging
from service.memory import freeze_loaded_objects
from service.messages import (
    EVERYONE,
    Cancel,
    Done,
    Failed,
    Heartbeat,
    Hello,
    Status,
    Submit,
    decode,
    encode,
    endpoints,
    heartbeat_every,
    new_socket,
    topic,
)
from service.metrics import Metrics
from service.settings import Settings
from service.tracing import setup as setup_tracing

log = logging.getLogger("service")
FLUSH_S = 0.5  # after a failed load: time for the front ends to read why before the process goes
POLL_MS = 100  # how often the main thread looks up from the socket (SIGTERM, a failed load, the heartbeat)


class Replies:
    """The batcher's sink in the engine process: finished requests back to their front ends, one message
    per front end and batch. Called from runner threads; the PUB socket is shared under a lock."""

    def __init__(self, socket: zmq.Socket, requests: dict):
        self.socket = socket
        self.requests = requests  # (identity, request id) -> (its model's Batcher, Ticket), for Cancel
        self.lock = threading.Lock()

    def deliver(self, tickets: list[Ticket]) -> None:
        by_front_end: dict[bytes, list[bytes]] = {}
        for ticket in tickets:
            identity, request_id = ticket.tag
            if self.requests.pop(ticket.tag, None) is None:
                continue  # cancelled: its client left
            error = ticket.error
            reply = Done(request_id, ticket.results, ticket.started, ticket.inference_s, ticket.batch_spans) \
                if error is None else Failed(request_id, error.kind, error.message, error.retry_after_s)
            by_front_end.setdefault(identity, []).append(encode(reply))
        for identity, frames in by_front_end.items():
            self.send(topic(identity), frames)

    def send(self, to: bytes, frames: list[bytes]) -> None:
        with self.lock:
            self.socket.send_multipart([to, *frames])


class EngineServer:
    def __init__(self, settings: Settings, directory: str, sources: dict | None = None):
        self.settings = settings
        self.directories = {name: found.path for name, found in (sources or {}).items()} or None
        self.context = zmq.Context()
        inbox_address, outbox_address = endpoints(directory)
        self.inbox = new_socket(self.context, zmq.PULL)
        self.inbox.bind(inbox_address)
        outbox = new_socket(self.context, zmq.PUB)
        outbox.setsockopt(zmq.LINGER, 1000)  # replies already sent go out before the process does
        outbox.bind(outbox_address)
        self.requests: dict[tuple[bytes, int], tuple[Batcher, Ticket]] = {}
        self.replies = Replies(outbox, self.requests)
        self.metrics = Metrics()
        self.status = Status("loading", "loading the model")
        self.models: EngineModels | None = None
        self.tracing = setup_tracing(settings, "engine")  # traces on: the batches' spans (the batcher finds it)
        self.stopping = threading.Event()

    def run(self) -> int:
        signal.signal(signal.SIGTERM, lambda *_: self.stopping.set())
        threading.Thread(target=self._load, name="bert-loader", daemon=True).start()
        try:
            beat_every = heartbeat_every(self.settings.stall_timeout_s)
            next_beat = time.monotonic()
            while not self.stopping.is_set() and self.status.state != "failed":
                if self.inbox.poll(max(1, min(POLL_MS, int(beat_every * 1000)))):
                    self._read()
                if self.status.state == "ready" and time.monotonic() >= next_beat:
                    # Sent by this thread, not the compute threads: a stopped process falls silent, a hung
                    # compute thread shows in the value (service.engine.batcher.Batcher.stalled_for).
                    self.replies.send(EVERYONE, [encode(Heartbeat(self.models.stalled_for()))])
                    next_beat = time.monotonic() + beat_every
            if self.status.state == "failed":
                time.sleep(FLUSH_S)
                return 1
            self._set_status(Status("draining", "shutting down"))
            if self.models is not None:
                self.models.stop()  # computes what is queued; its replies go out as it does
            return 0
        finally:
            if self.tracing is not None:
                self.tracing.shutdown()
            self.inbox.close()
            self.replies.socket.close()
            self.context.term()

    def _load(self) -> None:
        try:
            self.models = load_models(self.settings, self.metrics, self.directories)
        except Exception as exc:  # noqa: BLE001 - reported to the front ends and the log; the process exits 1
            log.error("cannot serve: %s", exc)
            print(f"error: {exc}", file=sys.stderr, flush=True)
            self._set_status(Status("failed", str(exc)))
            return
        freeze_loaded_objects()
        self._set_status(Status("ready", models=self.models.facts))

    def _set_status(self, status: Status) -> None:
        self.status = status
        self.replies.send(EVERYONE, [encode(status)])

    def _read(self) -> None:
        while True:
            try:
                identity, *frames = self.inbox.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            for frame in frames:
                try:
                    message = decode(frame)
                except (ValueError, TypeError) as exc:  # a bug, not a client: front ends send typed messages
                    log.error("undecodable message from %r: %s", identity, exc)
                    continue
                if isinstance(message, Submit):
                    self._submit(identity, message)
                elif isinstance(message, Cancel):
                    found = self.requests.pop((identity, message.request_id), None)
                    if found is not None:
                        batcher, ticket = found
                        batcher.cancel(ticket)  # its entries that have not run are dropped
                elif isinstance(message, Hello):
                    self.replies.send(topic(identity), [encode(self.status)])

    def _submit(self, identity: bytes, message: Submit) -> None:
        if self.models is None or self.status.state != "ready":
            reason = {"loading": "the model is still loading", "draining": "the server is shutting down"}
            self._refuse(identity, message.request_id, ServiceError(
                "unavailable", reason.get(self.status.state, "the engine is not ready"), retry_after_s=1))
            return
        batcher = self.models.batcher(message.model)
        if batcher is None:  # the front ends check names first: a front end of another server's models
            self._refuse(identity, message.request_id, ServiceError(
                "not_found", f"no model is named {message.model!r} here"))
            return
        key = (identity, message.request_id)
        ticket = Ticket(message.deadline, len(message.items), self.replies, tag=key, trace=message.trace,
                        finish=folder(message.items))
        self.requests[key] = (batcher, ticket)
        try:
            batcher.submit(message.items, ticket)
        except ServiceError as exc:  # the queue is full, or the batcher is stopping
            self.requests.pop(key, None)
            self._refuse(identity, message.request_id, exc)

    def _refuse(self, identity: bytes, request_id: int, error: ServiceError) -> None:
        self.replies.send(topic(identity), [encode(Failed(request_id, error.kind, error.message, error.retry_after_s))])


def main() -> int:
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the supervisor decides
    settings, record = read_launch_record()
    configure_logging(settings.log_level, settings.log_format, "engine")
    return EngineServer(settings, record["directory"], sources_from(record)).run()


if __name__ == "__main__":
    sys.exit(main())
