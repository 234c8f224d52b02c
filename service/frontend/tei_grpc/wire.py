"""The answers whose size grows with the model's width, written as protobuf bytes directly: a vector is one
length-delimited field of packed little-endian float32 (proto3's encoding of `repeated float`), so it leaves as
the numpy array's own bytes, with no Python float made per value (building an EmbedResponse through the
generated class costs a Python float per dimension). Everything else goes through the generated classes of
tei_pb2. tests/service/frontend/tei_grpc/test_wire.py parses these bytes with those classes.
"""

from __future__ import annotations

import numpy as np

# Field keys: (number << 3) | wire type (0 varint, 2 length-delimited).
_FIELD1_BYTES = b"\x0a"
_FIELD2_BYTES = b"\x12"
_ONE_BYTE = [bytes((value,)) for value in range(0x80)]


def varint(value: int) -> bytes:
    if value < 0x80:
        return _ONE_BYTE[value]
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def metadata(compute_chars: int, compute_tokens: int, total_ns: int, tokenization_ns: int, queue_ns: int,
             inference_ns: int) -> bytes:
    """A tei.v1.Metadata message: every field a varint, left out at zero (as proto3 writes them)."""
    out = bytearray()
    for number, value in enumerate((compute_chars, compute_tokens, total_ns, tokenization_ns, queue_ns, inference_ns),
                                   start=1):
        if value > 0:
            out += varint(number << 3)
            out += varint(value)
    return bytes(out)


def _floats(vector: np.ndarray) -> bytes:
    return np.ascontiguousarray(vector, dtype="<f4").tobytes()


def embed_response(vector: np.ndarray, meta: bytes) -> bytes:
    """tei.v1.EmbedResponse {embeddings = 1 (packed floats); metadata = 2}."""
    floats = _floats(vector)
    return b"".join((_FIELD1_BYTES, varint(len(floats)), floats, _FIELD2_BYTES, varint(len(meta)), meta))


def embed_all_response(vectors: np.ndarray, meta: bytes) -> bytes:
    """tei.v1.EmbedAllResponse {token_embeddings = 1 (TokenEmbedding {embeddings = 1}), one per token; metadata = 2}.
    Every token's message has the same length, so all of them are laid out in one array: (L, prefix + 4 H) bytes."""
    vectors = np.ascontiguousarray(vectors, dtype="<f4")
    tokens, width = vectors.shape
    inner = _FIELD1_BYTES + varint(4 * width)  # TokenEmbedding's field 1
    prefix = np.frombuffer(_FIELD1_BYTES + varint(len(inner) + 4 * width) + inner, dtype=np.uint8)
    rows = np.empty((tokens, len(prefix) + 4 * width), dtype=np.uint8)
    rows[:, :len(prefix)] = prefix
    rows[:, len(prefix):] = vectors.view(np.uint8).reshape(tokens, 4 * width)
    return b"".join((rows.tobytes(), _FIELD2_BYTES, varint(len(meta)), meta))
