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
    """Equal values, and numpy arrays equal in dtype, shape and contents; token ids read off the wire are int32
    memoryviews (service.messages), equal to the lists sent."""
    if isinstance(b, memoryview):
        assert b.format == "i" and list(b) == a, (a, b)
    elif isinstance(a, np.ndarray):
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


def test_an_embedding_requests_vectors_travel_as_one_array_and_come_back_as_vectors():
    matrix = rng.standard_normal((9, 384)).astype(np.float32)
    strided = rng.standard_normal((384, 2)).astype(np.float32)[:, 1]
    sent = Done(6, [PooledVector(matrix[row]) for row in (0, 4, 8)] + [PooledVector(strided)])
    frame = encode(sent)
    (_, fields), = msgpack.unpackb(frame, strict_map_key=False).items()
    (key, (dtype, shape, data)), = fields[1].items()  # the results: one stacked array, not four records
    assert key == -2 and dtype == "<f4" and shape == [384] and len(data) == 4 * 384 * 4
    received = decode(frame)
    _same(sent, received)
    assert [type(r) for r in received.results] == [PooledVector] * 4


@pytest.mark.parametrize("results", [
    [PooledVector(np.zeros(4, np.float32)), PooledVector(np.zeros(4, np.float16))],  # two dtypes
    [PooledVector(np.zeros(4, np.float32)), PooledVector(np.zeros(5, np.float32))],  # two shapes
    [PooledVector(np.zeros(4, np.float32)), ClassLogits(np.zeros(4, np.float32))],  # another kind of result
], ids=["dtypes", "shapes", "kinds"])
def test_results_that_do_not_stack_go_one_by_one_and_come_back_as_they_went(results):
    sent = Done(7, results)
    _same(sent, decode(encode(sent)))


def test_a_requests_token_ids_travel_as_two_arrays_and_any_item_mix_comes_back():
    items = [EncodeItem([101, 70000, 102], [0, 0, 0], "cls", False), NspItem([101, 5, 102, 6, 102], [0, 0, 0, 1, 1]),
             FillMaskItem([101, 103, 102], [0, 0, 0], [1], 3, [7592, 2088]), EncodeItem([101, 102], [0, 0])]
    frame = encode(Submit(8, items, 1.5, model="embed"))
    (_, fields), = msgpack.unpackb(frame, strict_map_key=False).items()
    (key, (ids, types, records)), = fields[1].items()
    assert key == -3 and np.frombuffer(ids, np.int32).tolist() == [t for i in items for t in i.input_ids]
    assert len(types) == 4 * 13 and [r[1:3] for r in records] == [[3, 3], [5, 5], [3, 3], [2, 2]]
    received = decode(frame)
    _same(Submit(8, items, 1.5, model="embed"), received)
    assert [len(item) for item in received.items] == [3, 5, 3, 2]


@pytest.mark.parametrize("frame", [
    msgpack.packb({1: [3, {-3: [np.zeros(3, np.int32).tobytes(), np.zeros(3, np.int32).tobytes(), [[7, 4, 3, "cls",
                                                                                                  False]]]}, 1.0]}),
    msgpack.packb({1: [3, {-3: [np.zeros(3, np.int32).tobytes(), np.zeros(3, np.int32).tobytes(), [[13, 3, 3]]]},
                       1.0]}),  # a result's tag where an item's goes
])
def test_items_whose_counts_or_tags_do_not_fit_are_refused_with_a_value_error(frame):
    with pytest.raises(ValueError):
        decode(frame)
