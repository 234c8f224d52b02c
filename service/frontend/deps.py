"""What the routes take from the app besides the request: the runtime, the model the request is for and its front
door, and the error bodies each family of routes documents. Every `routes_*.py` module imports these from here.

Which model: the one `/models/{name}/...` named (service.frontend.model_prefix puts its name in the request's
scope), else the default; the OpenAI route may also name one in its body (`Runtime.requested_model`).

The dependencies are coroutines on purpose: FastAPI runs plain-function dependencies in its thread pool, and
those hops cost every request CPU time and GIL hand-offs that slow the compute threads."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from service.errors import ServiceError
from service.frontend.colbert import ColbertDoor
from service.frontend.frontdoor import FrontDoor
from service.frontend.http_errors import STATUS
from service.frontend.model_prefix import MODEL_SCOPE, PATH_MODEL_SCOPE
from service.frontend.rerankers import Reranker
from service.frontend.runtime import Runtime, ServedModel
from service.frontend.schemas import ErrorBody, OpenAIError
from service.frontend.schemas_cohere import CohereError
from service.frontend.schemas_tei import TeiError


async def get_runtime(request: Request) -> Runtime:
    return request.app.state.runtime


def request_model(request: Request) -> str | None:
    """The model the request's path named (/models/{name}/...), or None."""
    return request.scope.get(PATH_MODEL_SCOPE)


async def get_model(request: Request) -> ServedModel:
    """The model the request is for (its name then labels the request's metrics); 503 while loading or shutting
    down."""
    model = request.app.state.runtime.ready_model(request_model(request))
    request.scope[MODEL_SCOPE] = model.name
    return model


async def get_frontdoor(request: Request) -> FrontDoor:
    """The front door of the model the request is for; 503 while loading or shutting down."""
    return (await get_model(request)).frontdoor


async def get_colbert(request: Request) -> ColbertDoor:
    """The ColBERT tasks of the model the request is for; 424 naming what the checkpoint has when it is not one."""
    model = await get_model(request)
    if model.colbert is None:
        raise ServiceError("unsupported", f"{request.url.path} needs a ColBERT (late-interaction) checkpoint, in "
                                          f"PyLate's or colbert-ai's format; this checkpoint has: "
                                          f"{model.frontdoor.heads()} (model {model.name})")
    return model.colbert


async def get_reranker(request: Request) -> Reranker:
    """What the model the request is for reranks with (service.frontend.rerankers)."""
    return (await get_model(request)).reranker


Door = Annotated[FrontDoor, Depends(get_frontdoor)]
Model = Annotated[ServedModel, Depends(get_model)]
State = Annotated[Runtime, Depends(get_runtime)]
Colbert = Annotated[ColbertDoor, Depends(get_colbert)]
Reranking = Annotated[Reranker, Depends(get_reranker)]

# The error answers each family documents in the OpenAPI document, each in its own body: ours, TEI's and OpenAI's.
ERRORS = {status: {"model": ErrorBody} for status in sorted(set(STATUS.values()) - {404, 405})}
TEI_ERRORS = {status: {"model": TeiError} for status in (400, 401, 413, 415, 422, 424, 429, 503)}
OPENAI_ERRORS = {status: {"model": OpenAIError} for status in (400, 401, 413, 415, 429, 500, 501, 503)}
COHERE_ERRORS = {status: {"model": CohereError} for status in (400, 401, 413, 415, 429, 500, 503)}
