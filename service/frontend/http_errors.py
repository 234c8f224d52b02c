"""The one place where failures become HTTP responses.

Every error kind has one status. The body's shape follows the API the route belongs to, so that
each API's own clients understand it:
- ours: `{"error": "...", "error_type": "<kind>"}`;
- OpenAI-compatible routes (`/v1/...`): `{"error": {"message", "type", "param", "code"}}`, with the
  types OpenAI uses, so the official clients raise their own exception classes;
- text-embeddings-inference routes (`/embed`, `/rerank`, ... and the root route): `{"error", "error_type"}`
  with TEI's error types spelled as TEI's server sends them (`Validation`, `Empty`, ...) and TEI's status
  for each type (Empty 400, Backend 424); kinds TEI has no type for keep our status and read `Validation`.
- Cohere-compatible rerank routes (`/v1/rerank`, `/v2/rerank`): `{"message": "..."}` as Cohere's API answers, with
  400 for a request that cannot succeed (Cohere's "invalid request"), so the `cohere` SDK raises its BadRequestError.
No traceback, file path or FastAPI `{"detail": ...}` body leaves the service.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from service.errors import ServiceError
from service.frontend.outputs import json_response

log = logging.getLogger("service")

STATUS = {
    "validation": 422,
    "empty": 422,  # a request with nothing to compute; TEI and OpenAI answer it with 400
    "unsupported": 501,
    "unauthorized": 401,
    "request_timeout": 408,  # the request's headers or body did not arrive in time (its connection is closed)
    "payload_too_large": 413,
    "unsupported_media_type": 415,
    "overloaded": 429,
    "unavailable": 503,
    "not_found": 404,
    "method_not_allowed": 405,
    "internal": 500,
}
COHERE_ROUTES = frozenset({"/v1/rerank", "/v2/rerank"})  # before OpenAI's /v1/ prefix
COHERE_STATUS = {"validation": 400, "empty": 400, "unsupported": 400}
OPENAI_PREFIX = "/v1/"
OPENAI_ROUTES = frozenset({"/embeddings"})  # TEI serves OpenAI's route without /v1 too
# TEI's routes, and the root route (TEI's and the Inference API's: huggingface_hub reads the "error" field).
TEI_ROUTES = frozenset({"/embed", "/embed_all", "/embed_sparse", "/tokenize", "/decode", "/similarity", "/predict",
                        "/rerank", "/", "/invocations"})
# OpenAI's error types; its clients choose the exception class from the status.
OPENAI_TYPES = {"validation": "invalid_request_error", "empty": "invalid_request_error", "unauthorized": "authentication_error",
                "overloaded": "rate_limit_error", "not_found": "not_found_error", "internal": "server_error",
                "unavailable": "server_error"}
# TEI's error types as its server spells them: the ErrorType enum of router/src/lib.rs has no serde rename, so
# the wire (and docs/openapi.json's enum) says "Validation", not "validation". A route the checkpoint has no
# head for is TEI's Backend ("Model is not a classifier model"), and so is a failure inside inference. TEI
# has no type for a refused key, body size, content type or method (its server answers those bare), so they
# read Validation: the request is at fault, and the status (401, 413, 415, 405) says which way.
TEI_TYPES = {"validation": "Validation", "empty": "Empty", "overloaded": "Overloaded", "unavailable": "Unhealthy",
             "internal": "Backend", "unsupported": "Backend"}
# OpenAI and TEI answer a bad request with 400 / 413 / 422 as their own servers do.
OPENAI_STATUS = {"validation": 400, "empty": 400}
TEI_STATUS = {"empty": 400, "unsupported": 424, "internal": 424}  # TEI's StatusCode::from(&ErrorType)
# Our routes of a task head (service.frontend.routes_tokens, routes_colbert) answer a checkpoint without that head as
# /predict does without a classifier: 424 (the request cannot succeed on this model), not a 5xx; the body keeps ours.
TASK_HEAD_ROUTES = frozenset({"/token-classification", "/question-answering", "/token-vectors"})


def api_of(path: str) -> str:
    if path in COHERE_ROUTES:
        return "cohere"
    if path.startswith(OPENAI_PREFIX) or path in OPENAI_ROUTES:
        return "openai"
    return "tei" if path in TEI_ROUTES else "ours"


def error_body(kind: str, message: str, path: str = "", param: str | None = None) -> tuple[int, dict]:
    """(status, body) for an error of `kind` on a route at `path`."""
    api = api_of(path)
    if api == "openai":
        code = kind if kind not in ("validation", "internal") else None
        return OPENAI_STATUS.get(kind, STATUS[kind]), {"error": {
            "message": message, "type": OPENAI_TYPES.get(kind, "invalid_request_error"), "param": param, "code": code}}
    if api == "tei":
        return TEI_STATUS.get(kind, STATUS[kind]), {"error": message, "error_type": TEI_TYPES.get(kind, "Validation")}
    if api == "cohere":
        return COHERE_STATUS.get(kind, STATUS[kind]), {"message": message}
    status = 424 if kind == "unsupported" and path in TASK_HEAD_ROUTES else STATUS[kind]
    return status, {"error": message, "error_type": "validation" if kind == "empty" else kind}


def error_response(kind: str, message: str, path: str = "", retry_after_s: float | None = None,
                   headers: dict[str, str] | None = None, param: str | None = None) -> Response:
    headers = dict(headers or {})
    if retry_after_s is not None:
        headers["Retry-After"] = str(max(1, round(retry_after_s)))
    if kind == "unauthorized":
        headers["WWW-Authenticate"] = "Bearer"
    status, body = error_body(kind, message, path, param)
    return json_response(body, status_code=status, headers=headers or None)


def _describe_validation(exc: RequestValidationError | ValidationError) -> tuple[str, str | None]:
    """A message naming the fields at fault, and the first such field."""
    problems, first = [], None
    for error in exc.errors()[:5]:
        if error.get("type") == "json_invalid":
            return "the request body is not valid JSON", None
        parts = [str(part) for part in error.get("loc", ()) if part != "body"]
        location = ".".join(parts) or "body"
        first = first or (parts[0] if parts else None)  # the request field, not the union branch
        problems.append(f"{location}: {error.get('msg', 'invalid')}")
    more = len(exc.errors()) - 5
    return "; ".join(problems) + (f" (and {more} more)" if more > 0 else ""), first


def respond(request: Request, kind: str, message: str, retry_after_s: float | None = None,
            headers: dict[str, str] | None = None, param: str | None = None, on_error=None) -> Response:
    if on_error is not None:
        on_error(kind, request)
    return error_response(kind, message, request.url.path, retry_after_s, headers, param)


def answer_exception(request: Request, exc: Exception, on_error=None) -> Response:
    """The response to an exception raised while answering `request`: a ServiceError as its kind says, a body
    that failed validation (anything with pydantic's `errors()`) as 422, anything else as 500."""
    if isinstance(exc, ServiceError):
        return respond(request, exc.kind, exc.message, exc.retry_after_s, param=exc.param, on_error=on_error)
    if isinstance(exc, (RequestValidationError, ValidationError)):
        message, param = _describe_validation(exc)
        return respond(request, "validation", message, param=param, on_error=on_error)
    log.error("internal error on %s", request.url.path, exc_info=exc)
    return respond(request, "internal", "internal error; the server log has the details", on_error=on_error)


def install_error_handlers(app: FastAPI, on_error=None) -> None:
    """`on_error(kind, request)` is called for every error response (metrics)."""

    @app.exception_handler(ServiceError)
    @app.exception_handler(RequestValidationError)
    @app.exception_handler(Exception)
    async def _answer(request: Request, exc: Exception):
        return answer_exception(request, exc, on_error)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        kind = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large", 401: "unauthorized"}.get(
            exc.status_code, "validation")
        message = {404: f"no route {request.url.path}", 405: f"{request.method} is not allowed on {request.url.path}"}
        # Starlette's own headers go out with our body; a 405's `Allow` (RFC 9110) lists every method of the
        # path (Starlette names only the last route it tried, and / has a page and an API route).
        headers = dict(exc.headers or {})
        documented = app.openapi()["paths"].get(request.url.path) if exc.status_code == 405 else None
        if documented:
            headers["Allow"] = ", ".join(sorted(method.upper() for method in documented))
        return respond(request, kind, message.get(exc.status_code, str(exc.detail)), headers=headers or None,
                       on_error=on_error)

