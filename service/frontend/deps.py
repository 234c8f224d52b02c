"""What the routes take from the app besides the request: the runtime, the loaded model's front door, and the
error bodies each family of routes documents. Every `routes_*.py` module imports these from here.

The dependencies are coroutines on purpose: FastAPI runs plain-function dependencies in its thread pool, and
those hops cost every request CPU time and GIL hand-offs that slow the compute threads."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from service.frontend.frontdoor import FrontDoor
from service.frontend.http_errors import STATUS
from service.frontend.runtime import Runtime
from service.frontend.schemas import ErrorBody, OpenAIError
from service.frontend.schemas_tei import TeiError


async def get_runtime(request: Request) -> Runtime:
    return request.app.state.runtime


async def get_frontdoor(request: Request) -> FrontDoor:
    """The loaded model's front door; 503 while loading or shutting down."""
    return request.app.state.runtime.ready_frontdoor()


Door = Annotated[FrontDoor, Depends(get_frontdoor)]
State = Annotated[Runtime, Depends(get_runtime)]

# The error answers each family documents in the OpenAPI document, each in its own body: ours, TEI's and OpenAI's.
ERRORS = {status: {"model": ErrorBody} for status in sorted(set(STATUS.values()) - {404, 405})}
TEI_ERRORS = {status: {"model": TeiError} for status in (400, 401, 413, 415, 422, 424, 429, 503)}
OPENAI_ERRORS = {status: {"model": OpenAIError} for status in (400, 401, 413, 415, 429, 500, 501, 503)}
