"""What the HTTP side and the engine say to each other: the only thing the two packages share.

`service.tasks` holds the work items and their results; this module adds the envelopes around them,
their wire form, and the channel that carries them. Messages are plain dataclasses; on the wire each
is a one-entry msgpack map from its type tag to its fields, and a numpy array one holding its dtype,
shape and raw bytes (a request's token ids go as two such arrays, an embedding request's vectors as one); no
pickle: nothing on the wire can name code to run.

    HTTP front end  --Hello, Submit, Cancel--------------> engine   PUSH -> PULL: [identity, message, message, ...]
    HTTP front end  <--Status, Done, Failed, Heartbeat---  engine   PUB -> SUB:   [topic(identity), message, ...]

Both sides put every message they have at one moment into one ZeroMQ message (a front end its requests
of one pass of its event loop, the engine the requests one batch finished for that front end): the
cost of a message is paid per batch, not per request.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from itertools import chain

import msgpack
import numpy as np
import zmq

from service.tasks import (
    ClassifyItem,
    ClassLogits,
    EncodeItem,
    FillMaskItem,
    FillMaskScores,
    Item,
    LateInteractionItem,
    MaskScores,
    NspItem,
    NspLogits,
    PooledVector,
    Result,
    SparseItem,
    SparseVector,
    SpanLogits,
    QaItem,
    TokenClassifyItem,
    Tokens,
    TokenLogits,
    TokenVectors,
    WindowItem,
)


@dataclass
class Hello:
    """A front end announces itself until it hears a Status back (its subscription works)."""

    worker: int  # the front end's pid, for the engine's log


@dataclass
class Submit:
    """One HTTP request's items, computed together or failed together."""

    request_id: int
    items: list[Item]
    deadline: float  # time.monotonic() by which they must reach the device (one clock for every process of a host)
    trace: str | None = None  # the request span's W3C traceparent when traced (service.tracing): its batches link to it
    model: str = ""  # the served model's name ("": the default model)


@dataclass
class Cancel:
    """The client went away: drop the request's items that have not run yet."""

    request_id: int


@dataclass
class ModelFacts:
    """What only the loaded model knows, and the HTTP side needs (heads, /info)."""

    device: str
    dtype: str
    has_mlm_head: bool
    has_nsp_head: bool
    num_labels: int
    batch_tokens_in_force: int
    batch_size_in_force: int
    cuda_graphs: int = 0  # encoder graphs live after the start-up check (service.engine.graphs); 0: all eager
    cuda_graphs_live: list[str] = dataclasses.field(default_factory=list)  # their names (tokens x slots[:depth])
    cuda_graphs_eager: list[str] = dataclasses.field(default_factory=list)  # "name: why" of those that fell back
    num_token_labels: int = 0  # outputs of a token-classification head (0: none)
    has_qa_head: bool = False  # an extractive question-answering head
    dtype_reason: str = ""  # how --dtype auto chose `dtype` on this host (empty for an explicit --dtype)
    name: str = ""  # the served model's name


@dataclass
class Status:
    """The engine's state: loading (with progress in `detail`), ready (with every model's facts, the default
    first), failed, or draining."""

    state: str
    detail: str = ""
    models: list[ModelFacts] = dataclasses.field(default_factory=list)


@dataclass
class Heartbeat:
    """The engine's pulse, to every front end a few times a second once it is ready: how long it has had work
    without finishing a batch. Its absence says the engine process is stopped or hung; its value that a thread
    or the device is."""

    stalled_for: float  # seconds; 0 while idle or making progress

    def problem(self, stall_timeout_s: float) -> str | None:
        """Why the engine counts as stuck, or None."""
        if self.stalled_for <= stall_timeout_s:
            return None
        return (f"the engine has had work and finished no batch for {self.stalled_for:.0f} s (a hung device or "
                "thread); restart the server")


def heartbeat_every(stall_timeout_s: float) -> float:
    """Seconds between the engine's Heartbeats: often enough that a few missed say more than a slow thread."""
    return min(0.5, stall_timeout_s / 5)


@dataclass
class Done:
    request_id: int
    results: list[Result]
    started: float = 0.0  # time.monotonic() when the first batch holding one of its inputs began
    inference_s: float = 0.0  # device time of the batches its inputs ran in, each counted once
    batch_spans: list[str] | None = None  # traceparents of those batches' spans, when the request is traced


@dataclass
class Failed:
    """A ServiceError of the engine side, for the HTTP side to answer with."""

    request_id: int
    kind: str
    message: str
    retry_after_s: float | None = None


Message = Hello | Submit | Cancel | Status | Done | Failed | Heartbeat

# Tags are the wire format: append, never renumber.
_TYPES = (Hello, Submit, Cancel, ModelFacts, Status, Done, Failed, EncodeItem, FillMaskItem, NspItem, ClassifyItem,
          SparseItem, TokenVectors, PooledVector, MaskScores, FillMaskScores, NspLogits, ClassLogits, SparseVector,
          Heartbeat, TokenClassifyItem, QaItem, TokenLogits, SpanLogits, WindowItem, LateInteractionItem)
_TAG = {cls: tag for tag, cls in enumerate(_TYPES)}
_FIELDS = {cls: tuple(f.name for f in dataclasses.fields(cls)) for cls in _TYPES}
_ARRAY = -1  # the map key of a numpy array: {-1: [dtype, shape, raw bytes]}
_POOLED = -2  # a list of pooled vectors of one dtype and shape: {-2: [dtype, one vector's shape, all their bytes]}
# A request's items, their token ids and type ids back to back in two int32 arrays and each item a plain list:
# {-3: [ids' bytes, type ids' bytes, [[tag, tokens, type ids, its other fields...], ...]]}
_ITEMS = -3
_ITEM_TYPES = frozenset(cls for cls in _TYPES if issubclass(cls, Tokens))
_ITEM_BY_TAG = {_TAG[cls]: cls for cls in _ITEM_TYPES}


def _wire(value):
    """`value` as msgpack's own types, in one pass of Python: a dataclass of _TYPES becomes the one-entry map
    {tag: [fields]}, a numpy array {-1: [dtype, shape, bytes]}; nothing else the messages carry is a map, so
    the decoder knows both by their shape. (msgpack's `default` hook with an extension type per object, packed
    on its own, cost 136 µs to send eight pooled vectors; this costs a fifth of that.)"""
    cls = type(value)
    if cls in _TAG:
        return {_TAG[cls]: [_wire_field(getattr(value, name)) for name in _FIELDS[cls]]}
    if cls is np.ndarray:
        return {_ARRAY: [value.dtype.str, value.shape, np.ascontiguousarray(value).tobytes()]}
    raise TypeError(f"cannot send a {cls.__name__}")


def _wire_field(value):
    cls = type(value)
    if cls in _TAG or cls is np.ndarray:
        return _wire(value)
    if cls is list and value:
        first = type(value[0])
        if first is PooledVector and (stacked := _stacked_vectors(value)) is not None:
            return stacked
        if first in _ITEM_TYPES:
            return _wire_items(value)
        if first in _TAG or first is np.ndarray:
            return [_wire(v) for v in value]  # results or records (a list of ints goes as it is)
    return value


def _stacked_vectors(results: list) -> dict | None:
    """An embedding request's results (pooled vectors of one dtype and shape) as one array, or None for any other
    list. The engine process encodes every reply on the threads that feed the device: eight vectors sent one by
    one cost 13.7 µs there, stacked 4.5."""
    vector = results[0].vector
    dtype, shape = vector.dtype, vector.shape
    if dtype.hasobject or not all(type(r) is PooledVector and r.vector.dtype == dtype and r.vector.shape == shape
                                  for r in results):
        return None
    return {_POOLED: [dtype.str, shape, b"".join([r.vector.tobytes() for r in results])]}


def _wire_items(items: list) -> dict:
    """A request's items with their token ids in two arrays. The engine process reads every request on the thread
    that also feeds the device, where a Python int per token, twice, cost more than the rest of the request (8
    inputs of 30 tokens: 10.7 µs to decode as lists, 8.3 µs so); and a batch's ids are then joined in one call."""
    if any(type(item) not in _ITEM_TYPES for item in items):
        raise TypeError("cannot send a list that mixes items with other values")
    ids = np.fromiter(chain.from_iterable(item.input_ids for item in items), dtype=np.int32)
    types = np.fromiter(chain.from_iterable(item.token_type_ids for item in items), dtype=np.int32)
    records = [[_TAG[type(item)], len(item.input_ids), len(item.token_type_ids),
                *[_wire_field(getattr(item, name)) for name in _FIELDS[type(item)][2:]]] for item in items]
    return {_ITEMS: [ids.tobytes(), types.tobytes(), records]}


def _unwire_items(ids: bytes, types: bytes, records: list) -> list:
    """The items of `_wire_items`. Their token ids and type ids are slices of one int32 memoryview each (a slice of
    a memoryview costs a third of a numpy array's), which the engine's collation joins as bytes."""
    ids_read, types_read = memoryview(ids).cast("i"), memoryview(types).cast("i")
    if sum(record[1] for record in records) != len(ids_read) or sum(r[2] for r in records) != len(types_read):
        raise ValueError("the items' token counts do not add up to their tokens")
    items, at, types_at = [], 0, 0
    for tag, count, type_count, *fields in records:  # a tag of no item: KeyError, which decode refuses
        item_ids, item_types = ids_read[at : at + count], types_read[types_at : types_at + type_count]
        items.append(_ITEM_BY_TAG[tag](item_ids, item_types, *fields))
        at, types_at = at + count, types_at + type_count
    return items


def _unwire(value):
    """Before `_wire`, from its maps (msgpack's object_hook: every map decoded, innermost first)."""
    (tag, fields), = value.items()
    if tag == _ARRAY:
        dtype, shape, data = fields
        return np.frombuffer(data, dtype=np.dtype(dtype)).reshape(shape)  # an object dtype refuses raw bytes
    if tag == _POOLED:
        dtype, shape, data = fields
        return [PooledVector(row) for row in np.frombuffer(data, dtype=np.dtype(dtype)).reshape((-1, *shape))]
    if tag == _ITEMS:
        return _unwire_items(*fields)
    return _TYPES[tag](*fields)


def _leftover(value):
    """What msgpack cannot pack of what `_wire_field` passed as it is: numpy scalars, records or arrays nested in
    a plain list; anything else is refused (by `_wire`)."""
    return value.item() if isinstance(value, np.generic) else _wire(value)


def encode(message: Message) -> bytes:
    return msgpack.packb(_wire(message), default=_leftover, use_bin_type=True)


def decode(frame: bytes) -> Message:
    try:
        message = msgpack.unpackb(frame, object_hook=_unwire, strict_map_key=False, raw=False)
    except (KeyError, IndexError, TypeError) as exc:  # a map that is no message of ours
        raise ValueError(f"not a message: {exc}") from None
    if not isinstance(message, (Hello, Submit, Cancel, Status, Done, Failed, Heartbeat)):
        raise ValueError("not a message")
    return message


def endpoints(directory: str) -> tuple[str, str]:
    """The engine's two sockets in a private directory: (what front ends send to, what they hear from)."""
    return f"ipc://{directory}/engine-in", f"ipc://{directory}/engine-out"


def topic(identity: bytes) -> bytes:
    """The PUB topic of one front end. The dot ends it: SUB matches prefixes, and front-end-1 must not
    hear front-end-10's replies."""
    return identity + b"."


EVERYONE = topic(b"*")  # Status changes go to every front end


def new_socket(context: zmq.Context, kind: int) -> zmq.Socket:
    """A socket as both sides use them: no high-water mark (the admission limit bounds what is in flight, and
    a full queue must not drop a reply), no lingering at close."""
    made = context.socket(kind)
    made.setsockopt(zmq.SNDHWM, 0)
    made.setsockopt(zmq.RCVHWM, 0)
    made.setsockopt(zmq.LINGER, 0)
    return made


class Receiver:
    """Reads a ZeroMQ socket on an asyncio loop without zmq.asyncio's future per message.

    The loop watches the socket's file descriptor; when it signals, every waiting message is read and
    handed to `on_frames`. ZeroMQ's descriptor signals edges, so it is read until empty each time, and
    once more whenever `check()` is called (after this process sends on a socket of the same context).
    """

    def __init__(self, socket: zmq.Socket, on_frames: Callable[[list[bytes]], None],
                 loop: asyncio.AbstractEventLoop):
        self.socket = socket
        self.on_frames = on_frames
        self.loop = loop
        self.fd = socket.getsockopt(zmq.FD)
        loop.add_reader(self.fd, self.drain)
        loop.call_soon(self.drain)

    def drain(self) -> None:
        while self.socket.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            self.on_frames(self.socket.recv_multipart(flags=zmq.NOBLOCK))

    def close(self) -> None:
        self.loop.remove_reader(self.fd)
        self.socket.close(linger=0)
