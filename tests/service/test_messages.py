"""The wire form of the messages between the front ends and the engine: every type comes back as it went."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from service.messages import Cancel, Done, Failed, Hello, ModelFacts, Status, Submit, decode, encode
from service.tasks import (
    ClassifyItem,
    ClassLogits,
    QaItem,
    SpanLogits,
    TokenClassifyItem,
    TokenLogits,
    EncodeItem,
    FillMaskItem,
    FillMaskScores,
    LateInteractionItem,
    MaskScores,
    NspItem,
    NspLogits,
    PooledVector,
    SparseItem,
    SparseVector,
    TokenVectors,
    WindowItem,
)

rng = np.random.default_rng(0)

MESSAGES = [
    Hello(1234),
    Cancel(7),
    Status("loading", "downloading 3 of 5 files"),
    Status("ready", models=[ModelFacts("cuda:0", "bfloat16", True, False, 3, 16384, 256, name="embed"),
                            ModelFacts("cpu", "int8", False, False, 1, 1024, 64, name="rerank")]),
    Status("ready", models=[ModelFacts("cpu", "float32", False, False, 0, 4096, 64, num_token_labels=9, has_qa_head=True)]),
    Failed(9, "overloaded", "the queue is full", 0.25),
    Submit(3, [EncodeItem([101, 7592, 102], [0, 0, 0], "mean", True),
               FillMaskItem([101, 103, 102], [0, 0, 0], [1], 5, None),
               FillMaskItem([101, 103, 102], [0, 0, 0], [1], 3, [7592, 2088]),
               NspItem([101, 1, 102, 2, 102], [0, 0, 0, 1, 1]),
               ClassifyItem([101, 5, 102], [0, 0, 0]),
               SparseItem([101, 6, 102], [0, 0, 0]),
               TokenClassifyItem([101, 7, 8, 102], [0, 0, 0, 0]),
               QaItem([101, 9, 102, 10, 11, 102], [0, 0, 0, 1, 1, 1]),
               WindowItem([101, 12, 13, 102], [0, 0, 0, 0], "mean", False, source=2, normalize_input=True),
               LateInteractionItem([101, 1, 14, 102, 103, 103], [0] * 6, keys=4),
               LateInteractionItem([101, 2, 15, 1010, 102], [0] * 5, kept=[0, 1, 2, 4])], 12345.678),
    Done(4, [PooledVector(rng.standard_normal(384).astype(np.float32)),
             TokenVectors(rng.standard_normal((5, 8)).astype(np.float16)),
             FillMaskScores([MaskScores(1, np.array([5, 9, 2], dtype=np.int64), np.array([0.5, 0.3, 0.2])),
                             MaskScores(4, np.array([], dtype=np.int64), np.array([], dtype=np.float32))]),
             NspLogits(np.array([2.5, -1.0], dtype=np.float32)),
             ClassLogits(rng.standard_normal(3).astype(np.float32)),
             SparseVector(np.array([3, 70, 2001], dtype=np.int32), np.array([0.1, 2.0, 0.7], dtype=np.float32)),
             TokenLogits(rng.standard_normal((4, 9)).astype(np.float32)),
             SpanLogits(rng.standard_normal(6).astype(np.float32), rng.standard_normal(6).astype(np.float32))]),
    Done(5, []),
]


def _same(a, b) -> None:
    """Equal values, and numpy arrays equal in dtype, shape and contents."""
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape, (a, b)
        np.testing.assert_array_equal(a, b)
    elif hasattr(a, "__dataclass_fields__"):
        assert type(a) is type(b), (a, b)
        for name in a.__dataclass_fields__:
            _same(getattr(a, name), getattr(b, name))
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), (a, b)
        for x, y in zip(a, b):
            _same(x, y)
    else:
        assert a == b and type(a) is type(b), (a, b)


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_comes_back_as_it_went(message):
    _same(message, decode(encode(message)))


def test_views_and_numpy_numbers_travel_as_their_values():
    matrix = rng.standard_normal((6, 4)).astype(np.float32)
    sent = Done(1, [TokenVectors(matrix[::2, 1:]), PooledVector(matrix.T[0])])  # neither is contiguous
    received = decode(encode(sent))
    np.testing.assert_array_equal(received.results[0].vectors, matrix[::2, 1:])
    np.testing.assert_array_equal(received.results[1].vector, matrix[:, 0])
    failed = decode(encode(Failed(np.int64(2), "overloaded", "full", np.float32(0.5))))
    assert failed.request_id == 2 and type(failed.request_id) is int and failed.retry_after_s == 0.5


@pytest.mark.parametrize("frame", [
    msgpack.packb({"a": 1}),  # a map that is no record
    msgpack.packb({99: [1]}),  # an unknown tag
    msgpack.packb({0: [1], 1: [2]}),  # two entries
    msgpack.packb({13: [{-1: ["|O", [1], b"\0" * 8]}]}),  # an array of Python objects from raw bytes
    msgpack.packb([1, 2, 3]),  # no message at all
    msgpack.packb({13: [np.zeros(2).tobytes()]}),  # a record, but not a message
])
def test_a_frame_that_is_no_message_is_refused_with_a_value_error(frame):
    with pytest.raises(ValueError):
        decode(frame)


def test_something_the_wire_cannot_carry_is_refused_at_the_sender():
    with pytest.raises(TypeError, match="cannot send"):
        encode(Submit(1, [EncodeItem([1], [0], "mean", True)], object()))
