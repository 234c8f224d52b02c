"""What the routes take from the app besides the request: the runtime, the loaded model's front door, and the
error bodies each family of routes documents. Every `routes_*.py` module imports these from here.

The dependencies are coroutines on purpose: FastAPI runs plain-function dependencies in its thread pool, and
those hops cost every request CPU time and GIL hand-offs that slow the compute threads."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from service.errors import ServiceError
from service.frontend.colbert import ColbertDoor
from service.frontend.frontdoor import FrontDoor
from service.frontend.http_errors import STATUS
from service.frontend.rerankers import Reranker
from service.frontend.runtime import Runtime
from service.frontend.schemas import ErrorBody, OpenAIError
from service.frontend.schemas_cohere import CohereError
from service.frontend.schemas_tei import TeiError


async def get_runtime(request: Request) -> Runtime:
    return request.app.state.runtime


async def get_frontdoor(request: Request) -> FrontDoor:
    """The loaded model's front door; 503 while loading or shutting down."""
    return request.app.state.runtime.ready_frontdoor()


async def get_colbert(request: Request) -> ColbertDoor:
    """The served ColBERT's tasks; 424 naming what the checkpoint has when it is not a ColBERT."""
    runtime: Runtime = request.app.state.runtime
    door = runtime.ready_frontdoor()
    if runtime.colbert is None:
        raise ServiceError("unsupported", f"{request.url.path} needs a ColBERT (late-interaction) checkpoint, in "
                                          f"PyLate's or colbert-ai's format; this checkpoint has: {door.heads()}")
    return runtime.colbert


async def get_reranker(request: Request) -> Reranker:
    """What the served model reranks with (service.frontend.rerankers). One model is served: the request's model
    name, where it sends one, is not needed to choose."""
    runtime: Runtime = request.app.state.runtime
    runtime.ready_frontdoor()
    return runtime.reranker


Door = Annotated[FrontDoor, Depends(get_frontdoor)]
State = Annotated[Runtime, Depends(get_runtime)]
Colbert = Annotated[ColbertDoor, Depends(get_colbert)]
Reranking = Annotated[Reranker, Depends(get_reranker)]

# The error answers each family documents in the OpenAPI document, each in its own body: ours, TEI's and OpenAI's.
ERRORS = {status: {"model": ErrorBody} for status in sorted(set(STATUS.values()) - {404, 405})}
TEI_ERRORS = {status: {"model": TeiError} for status in (400, 401, 413, 415, 422, 424, 429, 503)}
OPENAI_ERRORS = {status: {"model": OpenAIError} for status in (400, 401, 413, 415, 429, 500, 501, 503)}
COHERE_ERRORS = {status: {"model": CohereError} for status in (400, 401, 413, 415, 429, 500, 503)}
