"""text-embeddings-inference-compatible embedding routes, with TEI's request and response shapes and its
error body: `/embed` (pooled as the checkpoint says, normalized by default, Matryoshka `dimensions`),
`/embed_all` (one vector per token), `/embed_sparse` (SPLADE weights from the MLM head), `/similarity`,
`/tokenize` and `/decode`. Texts and token ids of the served tokenizer are both accepted as inputs."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from service.frontend.inputs import preparation
from service.frontend.outputs import json_response
from service.frontend.body import ParsedBodyRoute
from service.frontend.disconnects import client_gone
from service.frontend.deps import TEI_ERRORS, Door, Model
from service.frontend.schemas_tei import (
    TeiDecodeRequest,
    TeiEmbedAllRequest,
    TeiEmbedRequest,
    TeiEmbedSparseRequest,
    TeiSimilarityRequest,
    TeiSparseValue,
    TeiToken,
    TeiTokenizeRequest,
)

tei = APIRouter(route_class=ParsedBodyRoute, responses=TEI_ERRORS, tags=["TEI-compatible"])


@tei.post("/embed", response_model=list[list[float]], summary="Embeddings (TEI-compatible)")
async def embed(body: TeiEmbedRequest, request: Request, door: Door, model: Model) -> Response:
    """One pooled vector per input (pooling from the checkpoint's sentence-transformers config, else mean)."""
    prep = preparation(model.checkpoint.pooling, body.truncate, body.truncation_direction, body.prompt_name,
                       body.long_input)
    outputs = await door.encode(body.inputs, model.checkpoint.pooling.mode, body.normalize, prep,
                                gone=client_gone(request), dimensions=body.dimensions)
    return json_response([o.result.vector for o in outputs])


@tei.post("/embed_all", response_model=list[list[list[float]]], summary="Token embeddings (TEI-compatible)")
async def embed_all(body: TeiEmbedAllRequest, request: Request, door: Door, model: Model) -> Response:
    """One vector per token of each input, special tokens included, not normalized."""
    prep = preparation(model.checkpoint.pooling, body.truncate, body.truncation_direction, body.prompt_name)
    outputs = await door.encode(body.inputs, "none", False, prep, gone=client_gone(request))
    return json_response([o.result.vectors for o in outputs])


@tei.post("/embed_sparse", response_model=list[list[TeiSparseValue]], summary="Sparse embeddings (TEI-compatible)")
async def embed_sparse(body: TeiEmbedSparseRequest, request: Request, door: Door, model: Model) -> Response:
    """SPLADE weights over the vocabulary: max over tokens of log(1 + ReLU(MLM logits)), zeros left out."""
    prep = preparation(model.checkpoint.pooling, body.truncate, body.truncation_direction, body.prompt_name)
    vectors = await door.sparse(body.inputs, prep, gone=client_gone(request))
    return json_response([[{"index": int(i), "value": float(v)} for i, v in zip(s.indices, s.values)]
                          for s in vectors])


@tei.post("/similarity", response_model=list[float], summary="Sentence similarity (TEI-compatible)")
async def similarity(body: TeiSimilarityRequest, request: Request, door: Door, model: Model) -> Response:
    """Cosine similarity of source_sentence to each of sentences (the Hugging Face sentence-similarity task)."""
    params = body.parameters
    prep = preparation(model.checkpoint.pooling, params and params.truncate,
                       params.truncation_direction if params else "right", params and params.prompt_name)
    scores = await door.similarity(body.inputs.source_sentence, body.inputs.sentences, model.checkpoint.pooling.mode,
                                   prep, gone=client_gone(request))
    return json_response(scores)


@tei.post("/tokenize", response_model=list[list[TeiToken]], summary="Tokenize (TEI-compatible)")
async def tokenize(body: TeiTokenizeRequest, door: Door, model: Model) -> Response:
    """Each input's tokens: id, text, whether special, and character offsets into the input."""
    prep = preparation(model.checkpoint.pooling, False, "right", body.prompt_name)
    pieces = await door.tokenize(body.inputs, body.add_special_tokens, prompt=prep.prompt)
    return json_response([[{"id": p.id, "text": p.text, "special": p.special, "start": p.start, "stop": p.stop}
                           for p in input_pieces] for input_pieces in pieces])


@tei.post("/decode", response_model=list[str], summary="Decode token ids (TEI-compatible)")
async def decode(body: TeiDecodeRequest, door: Door) -> Response:
    """Token ids back to text, one string per id list."""
    sequences = body.ids if body.ids and isinstance(body.ids[0], list) else [body.ids]
    return json_response(door.decode(sequences, body.skip_special_tokens))
