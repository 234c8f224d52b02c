"""text-embeddings-inference-compatible routes, with TEI's request and response shapes and its error
body: `POST /embed` (pooled as the checkpoint says, normalized by default), `POST /embed_all` (one vector
per token, special tokens included), `POST /tokenize` (ids, text, special flag, character offsets)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from service.outputs import json_response
from service.routes import Door, State, client_gone, require_api_key
from service.schemas import TeiEmbedAllRequest, TeiEmbedRequest, TeiError, TeiToken, TeiTokenizeRequest

ERRORS = {status: {"model": TeiError} for status in (401, 413, 415, 422, 429, 500, 503)}
tei = APIRouter(dependencies=[Depends(require_api_key)], responses=ERRORS, tags=["TEI-compatible"])


@tei.post("/embed", response_model=list[list[float]], summary="Embeddings (TEI-compatible)")
async def embed(body: TeiEmbedRequest, request: Request, door: Door, state: State) -> Response:
    """One pooled vector per input (pooling from the checkpoint's sentence-transformers config, else mean)."""
    outputs = await door.encode(body.inputs, state.checkpoint.pooling.mode, body.normalize, bool(body.truncate),
                                gone=client_gone(request))
    return json_response([o.result.vector for o in outputs])


@tei.post("/embed_all", response_model=list[list[list[float]]], summary="Token embeddings (TEI-compatible)")
async def embed_all(body: TeiEmbedAllRequest, request: Request, door: Door) -> Response:
    """One vector per token of each input, special tokens included, not normalized."""
    outputs = await door.encode(body.inputs, "none", False, bool(body.truncate), gone=client_gone(request))
    return json_response([o.result.vectors for o in outputs])


@tei.post("/tokenize", response_model=list[list[TeiToken]], summary="Tokenize (TEI-compatible)")
async def tokenize(body: TeiTokenizeRequest, door: Door) -> Response:
    """Each input's tokens: id, text, whether special, and character offsets into the input."""
    pieces = await door.tokenize(body.inputs, body.add_special_tokens)
    return json_response([[{"id": p.id, "text": p.text, "special": p.special, "start": p.start, "stop": p.stop}
                           for p in input_pieces] for input_pieces in pieces])
