"""Cohere's rerank routes, so the `cohere` SDK pointed at this server (`base_url`) and the tools built on it
(LangChain's and LlamaIndex's Cohere rerankers) work unchanged: `POST /v1/rerank` and `POST /v2/rerank`. They score
with whatever the model reranks with (service.frontend.rerankers: a cross-encoder or a ColBERT), as `/rerank`
does, and answer errors in Cohere's body `{"message": ...}` (service.frontend.http_errors)."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Request
from starlette.responses import Response

from service.errors import ServiceError
from service.frontend.body import ParsedBodyRoute
from service.frontend.deps import COHERE_ERRORS, State, request_model
from service.frontend.disconnects import client_gone
from service.frontend.inputs import preparation
from service.frontend.model_prefix import MODEL_SCOPE
from service.frontend.outputs import json_response
from service.frontend.rerankers import RerankOptions, best_first
from service.frontend.schemas_cohere import CohereRerankRequest, CohereRerankResponse

cohere = APIRouter(route_class=ParsedBodyRoute, responses=COHERE_ERRORS, tags=["Cohere-compatible"])


@cohere.post("/v1/rerank", response_model=CohereRerankResponse, summary="Rerank (Cohere-compatible, v1)")
async def rerank_v1(body: CohereRerankRequest, request: Request, state: State) -> Response:
    """Each document's relevance to the query, best first, cut to `top_n`; `return_documents` adds their text.
    With several models, `model` picks one (as OpenAI's field does: docs/several-models.md)."""
    return await _rerank(body, request, state, "1")


@cohere.post("/v2/rerank", response_model=CohereRerankResponse, summary="Rerank (Cohere-compatible, v2)")
async def rerank_v2(body: CohereRerankRequest, request: Request, state: State) -> Response:
    """As /v1/rerank, in the shape of Cohere's v2 API (what LangChain's CohereRerank calls)."""
    return await _rerank(body, request, state, "2")


async def _rerank(body: CohereRerankRequest, request: Request, state: State, version: str) -> Response:
    model = state.requested_model(request_model(request), body.model)
    request.scope[MODEL_SCOPE] = model.name  # the request's metrics carry it
    documents = [d if isinstance(d, str) else d.text for d in body.documents]
    if not documents:
        raise ServiceError("empty", "documents is empty; send at least one document to rank", param="documents")
    top_n = len(documents) if body.top_n is None else body.top_n
    if not 1 <= top_n <= len(documents):
        raise ServiceError("validation", f"top_n must be between 1 and the number of documents ({len(documents)}), "
                                         f"got {top_n}", param="top_n")
    truncate = body.truncate or _cuts_documents(body, model.checkpoint)
    prep = preparation(model.checkpoint.pooling, truncate)
    scores = await model.reranker.scores(body.query, documents, RerankOptions(prep, chunk=body.long_input == "chunk"),
                                         gone=client_gone(request))
    best = best_first(scores)[:top_n]
    results = [{"index": int(i), "relevance_score": float(scores[i]),
                **({"document": {"text": documents[i]}} if body.return_documents else {})} for i in best]
    return json_response({"id": str(uuid.uuid4()), "results": results,
                          "meta": {"api_version": {"version": version}, "billed_units": {"search_units": 1}}})


def _cuts_documents(body: CohereRerankRequest, checkpoint) -> bool:
    """Whether Cohere's own length fields ask to cut documents; refuses those this server cannot honour."""
    if body.rank_fields not in (None, ["text"]):
        raise ServiceError("validation", "rank_fields: only [\"text\"] is supported (documents are ranked by their "
                                         "text)", param="rank_fields")
    if body.max_chunks_per_doc is not None:
        raise ServiceError("validation", "max_chunks_per_doc is not supported; send long_input: chunk to read long "
                                         "documents in windows", param="max_chunks_per_doc")
    if body.max_tokens_per_doc is None:
        return False
    recipe = checkpoint.late_interaction
    window = recipe.document_length if recipe is not None else checkpoint.tokenizer.model_max_length
    if body.max_tokens_per_doc < window:
        raise ServiceError("validation", f"max_tokens_per_doc below the model's window ({window} tokens) is not "
                                         "supported; leave it out, or send it at least that large to cut longer "
                                         "documents at the window", param="max_tokens_per_doc")
    return True
