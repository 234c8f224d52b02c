"""The answers written as bytes by hand (service.frontend.tei_grpc.wire) parse, with the generated classes, into
the messages they stand for."""

from __future__ import annotations

import numpy as np

from service.frontend.tei_grpc import tei_pb2 as pb
from service.frontend.tei_grpc import wire


def test_varints_round_trip_through_protobuf():
    for value in (0, 1, 127, 128, 300, 2**32 - 1, 2**63 + 5):
        message = pb.Metadata.FromString(b"\x18" + wire.varint(value))  # total_time_ns, uint64
        assert message.total_time_ns == value


def test_metadata_and_embed_response_parse_as_the_generated_classes_read_them():
    meta = wire.metadata(17, 6, 48_979_148, 85_026, 0, 2**40)
    parsed = pb.Metadata.FromString(meta)
    assert (parsed.compute_chars, parsed.compute_tokens, parsed.total_time_ns, parsed.tokenization_time_ns,
            parsed.queue_time_ns, parsed.inference_time_ns) == (17, 6, 48_979_148, 85_026, 0, 2**40)
    assert meta == pb.Metadata(compute_chars=17, compute_tokens=6, total_time_ns=48_979_148,
                               tokenization_time_ns=85_026, inference_time_ns=2**40).SerializeToString()
    vector = np.random.default_rng(0).standard_normal(384).astype(np.float32)
    answer = pb.EmbedResponse.FromString(wire.embed_response(vector, meta))
    np.testing.assert_array_equal(np.asarray(answer.embeddings, dtype=np.float32), vector)
    assert answer.metadata == parsed
    # float64 in (a pooled vector shortened in float64) leaves as float32, as `repeated float` is
    answer = pb.EmbedResponse.FromString(wire.embed_response(vector.astype(np.float64), b""))
    np.testing.assert_array_equal(np.asarray(answer.embeddings, dtype=np.float32), vector)
    assert not answer.HasField("metadata") or answer.metadata == pb.Metadata()


def test_token_embeddings_parse_token_by_token():
    for tokens, width in ((1, 1), (7, 32), (3, 384), (2, 40)):  # 40 floats: a one-byte length; 384: two bytes
        vectors = np.random.default_rng(tokens).standard_normal((tokens, width)).astype(np.float32)
        answer = pb.EmbedAllResponse.FromString(wire.embed_all_response(vectors, wire.metadata(3, tokens, 1, 0, 0, 0)))
        assert len(answer.token_embeddings) == tokens
        np.testing.assert_array_equal(np.stack([np.asarray(t.embeddings, np.float32) for t in answer.token_embeddings]),
                                      vectors)
        assert answer.metadata.compute_tokens == tokens
        # byte for byte what the generated class writes
        expected = pb.EmbedAllResponse(token_embeddings=[pb.TokenEmbedding(embeddings=row) for row in vectors.tolist()])
        expected.metadata.MergeFromString(wire.metadata(3, tokens, 1, 0, 0, 0))
        assert wire.embed_all_response(vectors, wire.metadata(3, tokens, 1, 0, 0, 0)) == expected.SerializeToString()
