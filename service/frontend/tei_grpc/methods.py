"""What each call of tei.v1 does with one request message, over the front door: the gRPC counterpart of the TEI
routes' modules (routes_tei.py, routes_classify.py), with the same checks and the same results. A streaming call
answers each of its messages with the same function (`service.frontend.tei_grpc.server` runs them). Each returns
the answer's protobuf bytes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Awaitable, Callable

import grpc

from service.errors import ServiceError
from service.frontend.frontdoor import FrontDoor, Waiter
from service.frontend.inputs import Preparation, preparation
from service.frontend.outputs import labelled
from service.frontend.request_record import RequestRecord
from service.frontend.rerankers import RerankOptions, best_first
from service.frontend.runtime import Runtime
from service.frontend.tei_grpc import tei_pb2 as pb
from service.frontend.tei_grpc import wire
from service.frontend.tei_grpc.errors import CallError, invalid

DIRECTIONS = {pb.TRUNCATION_DIRECTION_RIGHT: "right", pb.TRUNCATION_DIRECTION_LEFT: "left"}
MODEL_TYPES = {"embedding": pb.MODEL_TYPE_EMBEDDING, "classifier": pb.MODEL_TYPE_CLASSIFIER,
               "reranker": pb.MODEL_TYPE_RERANKER}


@dataclass
class Call:
    """What answering one message needs: the runtime and its front door, how to notice the caller leave, and the
    message's record (its timings fill the answer's Metadata)."""

    runtime: Runtime
    door: FrontDoor
    gone: Waiter
    record: RequestRecord

    def prep(self, truncate: bool, direction: int, prompt_name: str | None = None) -> Preparation:
        if direction not in DIRECTIONS:
            raise invalid(f"truncation_direction {direction} is not a TruncationDirection (0 right, 1 left)")
        return preparation(self.runtime.checkpoint.pooling, truncate, DIRECTIONS[direction], prompt_name)

    def metadata(self, chars: int) -> bytes:
        """tei.v1.Metadata of this message so far: characters, tokens, and where its time went."""
        r = self.record
        queue_end = r.batch_started or r.computed
        return wire.metadata(chars, r.tokens, _ns(time.monotonic() - r.received),
                             _ns(r.tokenized - r.tokenize_started), _ns(queue_end - r.submitted if r.submitted else 0),
                             _ns(r.inference_s))


def mean_metadata(records: list[RequestRecord], started: float) -> bytes:
    """tei.v1.Metadata of many messages answered as one (RerankStream): characters and tokens summed, total time
    from `started`, and each step's time the mean over the messages (as TEI reports it)."""
    count = max(1, len(records))
    return wire.metadata(
        sum(r.chars for r in records), sum(r.tokens for r in records), _ns(time.monotonic() - started),
        _ns(sum(r.tokenized - r.tokenize_started for r in records) / count),
        _ns(sum((r.batch_started or r.computed) - r.submitted for r in records if r.submitted) / count),
        _ns(sum(r.inference_s for r in records) / count))


def _ns(seconds: float) -> int:
    return max(0, int(seconds * 1e9))


def _optional(message, field: str):
    return getattr(message, field) if message.HasField(field) else None


async def embed(call: Call, m: pb.EmbedRequest) -> bytes:
    """As POST /embed with one input: pooled as the checkpoint says, normalized unless `normalize` is false."""
    pooling = call.runtime.checkpoint.pooling
    prep = call.prep(m.truncate, m.truncation_direction, _optional(m, "prompt_name"))
    normalize = m.normalize if m.HasField("normalize") else True
    outputs = await call.door.encode(m.inputs, pooling.mode, normalize, prep, gone=call.gone,
                                     dimensions=_optional(m, "dimensions"))
    return wire.embed_response(outputs[0].result.vector, call.metadata(len(m.inputs)))


async def embed_all(call: Call, m: pb.EmbedAllRequest) -> bytes:
    """As POST /embed_all with one input: a vector per token, special tokens included."""
    prep = call.prep(m.truncate, m.truncation_direction, _optional(m, "prompt_name"))
    outputs = await call.door.encode(m.inputs, "none", False, prep, gone=call.gone)
    return wire.embed_all_response(outputs[0].result.vectors, call.metadata(len(m.inputs)))


async def embed_sparse(call: Call, m: pb.EmbedSparseRequest) -> bytes:
    """As POST /embed_sparse with one input: the non-zero SPLADE weights, by vocabulary index."""
    prep = call.prep(m.truncate, m.truncation_direction, _optional(m, "prompt_name"))
    (vector,) = await call.door.sparse(m.inputs, prep, gone=call.gone)
    answer = pb.EmbedSparseResponse(sparse_embeddings=[
        pb.SparseValue(index=i, value=v) for i, v in zip(vector.indices.tolist(), vector.values.tolist())])
    answer.metadata.MergeFromString(call.metadata(len(m.inputs)))
    return answer.SerializeToString()


async def _predict(call: Call, entry, chars: int, truncate: bool, direction: int, raw_scores: bool) -> bytes:
    prep = call.prep(truncate, direction)
    (logits,) = await call.door.classify([entry], prep, gone=call.gone)
    spec = call.runtime.checkpoint.labels
    answer = pb.PredictResponse(predictions=[pb.Prediction(score=p["score"], label=p["label"])
                                             for p in labelled(spec.scores(logits, raw=raw_scores), spec.labels)])
    answer.metadata.MergeFromString(call.metadata(chars))
    return answer.SerializeToString()


async def predict(call: Call, m: pb.PredictRequest) -> bytes:
    """As POST /predict with one text: every label's score, best first."""
    return await _predict(call, m.inputs, len(m.inputs), m.truncate, m.truncation_direction, m.raw_scores)


async def predict_pair(call: Call, m: pb.PredictPairRequest) -> bytes:
    """As POST /predict with one text (one element) or one [text, text_pair] pair (two)."""
    if len(m.inputs) not in (1, 2):
        raise invalid(f"inputs must hold one text or two (a text and its pair); it has {len(m.inputs)}")
    entry = m.inputs[0] if len(m.inputs) == 1 else list(m.inputs)
    return await _predict(call, entry, sum(map(len, m.inputs)), m.truncate, m.truncation_direction, m.raw_scores)


async def rerank(call: Call, m: pb.RerankRequest) -> bytes:
    """As POST /rerank: every text's score against the query, best first."""
    prep = call.prep(m.truncate, m.truncation_direction)
    texts = list(m.texts)
    reranker = call.runtime.default_model.reranker  # a cross-encoder's, or a ColBERT's MaxSim
    scores = await reranker.scores(m.query, texts, RerankOptions(prep, raw_scores=m.raw_scores, field="texts"),
                                   gone=call.gone)
    chars = len(m.query) * len(texts) + sum(map(len, texts))
    return ranks_answer([(int(i), float(scores[i]), texts[i] if m.return_text else None) for i in best_first(scores)],
                        call.metadata(chars))


def ranks_answer(ranks: list[tuple[int, float, str | None]], meta: bytes) -> bytes:
    """tei.v1.RerankResponse of (index, score, text or None) in the order given."""
    answer = pb.RerankResponse(ranks=[pb.Rank(index=i, score=s, text=t) for i, s, t in ranks])  # text None: unset
    answer.metadata.MergeFromString(meta)
    return answer.SerializeToString()


async def rerank_one(call: Call, m: pb.RerankStreamRequest, raw_scores: bool) -> float:
    """One message of RerankStream: the score of its (query, text) pair (`raw_scores` is the stream's first's)."""
    prep = call.prep(m.truncate, m.truncation_direction)
    reranker = call.runtime.default_model.reranker
    (score,) = await reranker.scores(m.query, [m.text], RerankOptions(prep, raw_scores=raw_scores, field="text"),
                                     gone=call.gone)
    call.record.chars = len(m.query) + len(m.text)
    return float(score)


async def tokenize(call: Call, m: pb.EncodeRequest) -> bytes:
    """As POST /tokenize with one text (add_special_tokens is proto3's: false unless set)."""
    prep = call.prep(False, pb.TRUNCATION_DIRECTION_RIGHT, _optional(m, "prompt_name"))
    (pieces,) = await call.door.tokenize(m.inputs, m.add_special_tokens, prompt=prep.prompt)
    return pb.EncodeResponse(tokens=[  # start and stop None (a special token): unset
        pb.SimpleToken(id=p.id, text=p.text, special=p.special, start=p.start, stop=p.stop) for p in pieces
    ]).SerializeToString()


async def decode(call: Call, m: pb.DecodeRequest) -> bytes:
    """As POST /decode with one list of ids."""
    (text,) = call.door.decode([list(m.ids)], m.skip_special_tokens)
    return pb.DecodeResponse(text=text).SerializeToString()


async def info(call: Call, m: pb.InfoRequest) -> bytes:
    """As GET /info's text-embeddings-inference fields."""
    facts = call.runtime.info()
    (kind,) = facts["model_type"]
    return pb.InfoResponse(
        version=facts["version"], sha=facts["sha"], docker_label=facts["docker_label"], model_id=facts["model_id"],
        model_sha=facts["model_sha"], model_dtype=facts["model_dtype"] or "", model_type=MODEL_TYPES[kind],
        max_concurrent_requests=facts["max_concurrent_requests"], max_input_length=facts["max_input_length"],
        max_batch_tokens=facts["max_batch_tokens"], max_batch_requests=facts["max_batch_requests"],
        max_client_batch_size=facts["max_client_batch_size"], tokenization_workers=facts["tokenization_workers"],
    ).SerializeToString()


def parse(rpc: "Rpc", raw: bytes, limit: int):
    """The call's request message from its bytes: INVALID_ARGUMENT when they are not one (the gRPC library's own
    deserializer would answer INTERNAL), RESOURCE_EXHAUSTED over `limit` (max_body_bytes)."""
    if len(raw) > limit:
        raise ServiceError("payload_too_large", f"the message has {len(raw)} bytes; the limit is {limit} "
                                                "(max_body_bytes)")
    try:
        return rpc.request.FromString(raw)
    except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError and its kin: the client's bytes
        raise CallError(grpc.StatusCode.INVALID_ARGUMENT, f"the message is not a valid "
                        f"{rpc.request.DESCRIPTOR.full_name} ({exc})", "validation") from None


Answer = Callable[[Call, object], Awaitable[bytes]]


@dataclass(frozen=True)
class Rpc:
    service: str  # tei.v1.<service>
    name: str
    request: type  # the request message's class
    answer: Answer | None  # one message -> its answer's bytes (None: RerankStream, answered by the server itself)
    kind: str  # unary, stream (a stream of answers to a stream of messages), or collect (many messages, one answer)
    computes: bool = True  # holds an admission slot per message (Info, Tokenize and Decode compute nothing)

    @property
    def path(self) -> str:
        return f"/{self.service}/{self.name}"


RPCS = (
    Rpc("tei.v1.Info", "Info", pb.InfoRequest, info, "unary", computes=False),
    Rpc("tei.v1.Embed", "Embed", pb.EmbedRequest, embed, "unary"),
    Rpc("tei.v1.Embed", "EmbedStream", pb.EmbedRequest, embed, "stream"),
    Rpc("tei.v1.Embed", "EmbedSparse", pb.EmbedSparseRequest, embed_sparse, "unary"),
    Rpc("tei.v1.Embed", "EmbedSparseStream", pb.EmbedSparseRequest, embed_sparse, "stream"),
    Rpc("tei.v1.Embed", "EmbedAll", pb.EmbedAllRequest, embed_all, "unary"),
    Rpc("tei.v1.Embed", "EmbedAllStream", pb.EmbedAllRequest, embed_all, "stream"),
    Rpc("tei.v1.Predict", "Predict", pb.PredictRequest, predict, "unary"),
    Rpc("tei.v1.Predict", "PredictPair", pb.PredictPairRequest, predict_pair, "unary"),
    Rpc("tei.v1.Predict", "PredictStream", pb.PredictRequest, predict, "stream"),
    Rpc("tei.v1.Predict", "PredictPairStream", pb.PredictPairRequest, predict_pair, "stream"),
    Rpc("tei.v1.Rerank", "Rerank", pb.RerankRequest, rerank, "unary"),
    Rpc("tei.v1.Rerank", "RerankStream", pb.RerankStreamRequest, None, "collect"),
    Rpc("tei.v1.Tokenize", "Tokenize", pb.EncodeRequest, tokenize, "unary", computes=False),
    Rpc("tei.v1.Tokenize", "TokenizeStream", pb.EncodeRequest, tokenize, "stream", computes=False),
    Rpc("tei.v1.Tokenize", "Decode", pb.DecodeRequest, decode, "unary", computes=False),
    Rpc("tei.v1.Tokenize", "DecodeStream", pb.DecodeRequest, decode, "stream", computes=False),
)
SERVICES = tuple(dict.fromkeys(rpc.service for rpc in RPCS))
