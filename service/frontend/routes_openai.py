"""OpenAI-compatible routes, so the `openai` client and the RAG stacks built on it (LangChain's and
LlamaIndex's OpenAI embeddings) can point here: `POST /v1/embeddings`, `GET /v1/models`.

Vectors are pooled as the checkpoint's sentence-transformers recipe says (mean otherwise) and always
normalized, as OpenAI's are. Errors have OpenAI's body (`service.frontend.http_errors`), so the client raises
its own exception classes.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from service.errors import ServiceError
from service.frontend.inputs import preparation
from service.frontend.outputs import b64_floats, json_response
from service.frontend.body import ParsedBodyRoute
from service.frontend.disconnects import client_gone
from service.frontend.deps import OPENAI_ERRORS, State, request_model
from service.frontend.model_prefix import MODEL_SCOPE
from service.frontend.schemas import OpenAIEmbeddingsRequest, OpenAIEmbeddingsResponse

openai = APIRouter(prefix="/v1", route_class=ParsedBodyRoute, responses=OPENAI_ERRORS, tags=["OpenAI-compatible"])
# text-embeddings-inference serves OpenAI's embeddings route without the /v1 prefix too.
openai_alias = APIRouter(route_class=ParsedBodyRoute, responses=OPENAI_ERRORS, tags=["OpenAI-compatible"])


@openai_alias.post("/embeddings", response_model=OpenAIEmbeddingsResponse, summary="Embeddings (OpenAI-compatible)")
@openai.post("/embeddings", response_model=OpenAIEmbeddingsResponse, summary="Embeddings (OpenAI-compatible)")
async def embeddings(body: OpenAIEmbeddingsRequest, request: Request, state: State) -> Response:
    """Normalized sentence embeddings, pooled as the checkpoint says; `encoding_format` float or base64;
    `dimensions` keeps the first N and normalises again (Matryoshka). Also served at /embeddings. With several
    models, `model` picks one (none: the default); with one, any `model` is answered by it."""
    if not isinstance(body.input, str) and any(not isinstance(x, str) for x in body.input):
        raise ServiceError("validation", "input must be a string or a list of strings; token-id arrays are not "
                           "accepted: they are ids of OpenAI's tokenizer (tiktoken), not this model's. LangChain's "
                           "OpenAIEmbeddings sends them by default: pass check_embedding_ctx_length=False to send "
                           "text", param="input")
    model = state.requested_model(request_model(request), body.model)
    request.scope[MODEL_SCOPE] = model.name  # the request's metrics carry it
    # the checkpoint's default prompt, if it has one
    prep = preparation(model.checkpoint.pooling, False, long_input=body.long_input)
    outputs = await model.frontdoor.encode(body.input, model.checkpoint.pooling.mode, True, prep,
                                           gone=client_gone(request), field="input", dimensions=body.dimensions,
                                           base64=body.encoding_format == "base64")
    data = []
    for index, output in enumerate(outputs):
        vector = output.result.vector
        data.append({"object": "embedding", "index": index,
                     "embedding": b64_floats(vector) if body.encoding_format == "base64" else vector})
    tokens = sum(o.token_count for o in outputs)
    return json_response({"object": "list", "data": data, "model": model.display_name,
                          "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


@openai.get("/models", summary="Models (OpenAI-compatible)")
async def models(state: State) -> Response:
    """Every served model, the default first (its `id` is what `model` takes)."""
    return json_response({"object": "list", "data": [
        {"id": m.display_name, "object": "model", "created": 0, "owned_by": "bert-serve"} for m in state.models.values()]})
