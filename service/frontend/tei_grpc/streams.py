"""The streaming calls of tei.v1 (docs/grpc.md, "How a call is served"): a reader task takes the client's messages,
each computed in its own task (at most grpc_stream_window at once, each holding an admission slot, waited for when
the server is full), and the handler hands back their answers in the order sent. The first message that fails ends
the stream with its status, after the answers before it; a stream with nothing in flight that sends nothing for
keep_alive_s ends DEADLINE_EXCEEDED. RerankStream collects its pairs' scores into one ranking at the end.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol

import grpc

from service.errors import ServiceError
from service.frontend.request_record import RequestRecord
from service.frontend.tei_grpc import methods, tei_pb2
from service.frontend.tei_grpc.errors import CallError, status_of
from service.frontend.tei_grpc.methods import Call, Rpc, parse
from service.logs import CURRENT_REQUEST
from service.tracing import TraceContext


class GrpcFrontEnd(Protocol):
    """What the streams need of the gRPC server (service.frontend.tei_grpc.server.GrpcFrontEnd, which imports this
    module: a Protocol here rather than an import back)."""

    runtime: Any  # service.frontend.runtime.Runtime
    settings: Any  # service.settings.Settings
    requests: Any  # the admission count shared with HTTP
    tracing: Any  # service.tracing.Tracing, or None with traces off

    def open_call(self, metadata: dict[str, str]) -> Any: ...

    async def admit_waiting(self) -> None: ...

    def begin(self, rpc: Rpc, context, metadata: dict[str, str]) -> RequestRecord: ...

    def ended(self, rpc: Rpc, record: RequestRecord, code: grpc.StatusCode, kind: str | None, name: str,
              attributes: dict | None = None, request: bool = True) -> None: ...

    def cancelled_code(self, context) -> grpc.StatusCode: ...

OK = grpc.StatusCode.OK
RANK_BYTES = 24  # a Rank's share of a RerankStream's answer without its text, for the answer's size bound
_END, _IDLE = object(), object()  # a stream's reader: the client finished; nothing heard for keep_alive_s


def call_metadata(context) -> dict[str, str]:
    return {key: value for key, value in (context.invocation_metadata() or ()) if isinstance(value, str)}


def answer_each(front: GrpcFrontEnd, rpc: Rpc):
    """The handler of a streaming call: each message answered by `rpc.answer`, in order."""
    async def handler(request_iterator, context):
        async for answer in answers(front, rpc, request_iterator, context, rpc.answer):
            yield answer

    return handler


def rerank_stream(front: GrpcFrontEnd, rpc: Rpc):
    """The handler of RerankStream: a (query, text) pair a message, one ranking of them all at the end."""
    async def handler(request_iterator, context):
        first: dict[str, bool] = {}
        limit = front.settings.max_response_mb * 1e6
        size = 0

        async def score(call: Call, m: tei_pb2.RerankStreamRequest):
            nonlocal size
            if not first:  # the stream's first message sets raw_scores and return_text (messages start in order)
                first.update(raw=m.raw_scores, text=m.return_text)
            size += RANK_BYTES + (len(m.text.encode()) if first["text"] else 0)
            if size > limit:
                raise ServiceError("validation", f"the ranking would exceed {front.settings.max_response_mb:g} MB "
                                                 "(max_response_mb); send fewer pairs per stream")
            return await methods.rerank_one(call, m, first["raw"]), m.text if first["text"] else None, call.record

        started = time.monotonic()
        scored = [one async for one in answers(front, rpc, request_iterator, context, score)]
        if not scored:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the stream sent no (query, text) pair to rank")
        order = sorted(range(len(scored)), key=lambda i: -scored[i][0])  # stable: ties keep the sent order
        return methods.ranks_answer([(i, scored[i][0], scored[i][1]) for i in order],
                                    methods.mean_metadata([record for _, _, record in scored], started))

    return handler


async def answers(front: GrpcFrontEnd, rpc: Rpc, request_iterator, context, answer_one):
    """Each message's answer (`answer_one(call, message)`), in the order sent; a failure ends the call with its
    status, after the answers before it. The reader holds a message's admission slot from before its task starts
    until its answer is taken here (or the stream ends)."""
    metadata = call_metadata(context)
    record = front.begin(rpc, context, metadata)
    loop = asyncio.get_running_loop()
    code, kind, message = OK, None, ""
    messages = 0
    try:
        front.open_call(metadata)
    except Exception as exc:  # noqa: BLE001 - refused before reading anything
        code, message, kind = status_of(exc, rpc.path)
        front.ended(rpc, record, code, kind, rpc.path[1:], request=False)
        await context.abort(code, message)

    window = asyncio.Semaphore(front.settings.grpc_stream_window)
    queue: asyncio.Queue = asyncio.Queue()
    idle_s = front.settings.keep_alive_s
    state = {"heard": loop.time(), "in_flight": 0, "done": False}
    parent = record.trace or record.caller

    def spawn(raw: bytes, index: int) -> asyncio.Task:
        return loop.create_task(_message(front, rpc, raw, index, record, parent, answer_one))

    async def read() -> None:
        index = 0
        try:
            async for raw in request_iterator:
                state["heard"] = loop.time()
                await window.acquire()
                if rpc.computes:
                    await front.admit_waiting()
                index += 1
                state["in_flight"] += 1
                queue.put_nowait(spawn(raw, index))
            queue.put_nowait(_END)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the library failed to read (a client that reset the stream)
            queue.put_nowait(exc)

    def watch_idle() -> None:
        if state["done"]:
            return
        quiet = loop.time() - state["heard"]
        if quiet >= idle_s and not state["in_flight"]:
            queue.put_nowait(_IDLE)
            return
        state["timer"] = loop.call_later(max(0.05, idle_s - quiet), watch_idle)

    reader = loop.create_task(read())
    state["timer"] = loop.call_later(idle_s, watch_idle)
    try:
        while True:
            item = await queue.get()
            if item is _END:
                break
            if item is _IDLE:
                raise ServiceError("request_timeout", f"the stream sent no message for {idle_s:g} s with none in "
                                                      "flight (keep_alive_s); open a new one when there is more")
            if isinstance(item, BaseException):
                raise item
            try:
                answer = await item
            finally:
                _release(front, rpc, window, state)
            messages += 1
            yield answer
    except (asyncio.CancelledError, GeneratorExit):
        code = front.cancelled_code(context)
        raise
    except Exception as exc:  # noqa: BLE001 - the message's status ends the stream
        code, message, kind = status_of(exc, rpc.path)
    finally:
        state["done"] = True
        state["timer"].cancel()
        reader.cancel()
        while not queue.empty():  # messages not answered: their inputs are dropped from the engine's queue
            left = queue.get_nowait()
            if isinstance(left, asyncio.Task):
                left.cancel()
                _release(front, rpc, window, state)
        front.ended(rpc, record, code, kind, rpc.path[1:], {"bert.messages": messages}, request=False)
    if code is not OK:
        await context.abort(code, message)


def _release(front: GrpcFrontEnd, rpc: Rpc, window: asyncio.Semaphore, state: dict) -> None:
    """A stream's message is done with: its place in the window, and its admission slot."""
    window.release()
    state["in_flight"] -= 1
    if rpc.computes:
        front.requests.add(-1)


async def _message(front: GrpcFrontEnd, rpc: Rpc, raw: bytes, index: int, stream: RequestRecord,
                   parent: TraceContext | None, answer_one):
    """One message of a stream, in its own task, with its own request record."""
    record = RequestRecord(f"{stream.request_id}.{index}", rpc.path, time.monotonic(), caller=parent,
                           deadline=stream.deadline)
    if stream.trace is not None:
        record.trace = TraceContext(stream.trace.trace_id, front.tracing.new_id())
    CURRENT_REQUEST.set(record)  # this task's own context
    front.runtime.requests.accepted += 1
    code, kind = OK, None
    try:
        door = front.runtime.ready_frontdoor()  # a draining server takes no new message (as HTTP, no new request)
        return await answer_one(Call(front.runtime, door, None, record), parse(rpc, raw, front.settings.max_body_bytes))
    except asyncio.CancelledError:
        code = grpc.StatusCode.CANCELLED
        raise
    except Exception as exc:  # noqa: BLE001 - carried to the stream, which ends with it
        code, message, kind = status_of(exc, rpc.path)
        raise CallError(code, message, kind) from None
    finally:
        front.ended(rpc, record, code, kind, f"{rpc.path[1:]} message", {"bert.message": index})
