"""The one place where failures become HTTP responses: `{"error": "...", "error_type": "..."}`.

No traceback, file path or FastAPI `{"detail": ...}` body leaves the service.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.outputs import json_response

log = logging.getLogger("service")

STATUS = {
    "validation": 422,
    "unsupported": 501,
    "unauthorized": 401,
    "payload_too_large": 413,
    "unsupported_media_type": 415,
    "overloaded": 429,
    "unavailable": 503,
    "not_found": 404,
    "method_not_allowed": 405,
    "internal": 500,
}


class ServiceError(Exception):
    """A failure with a kind from STATUS and a message fit for the client."""

    def __init__(self, kind: str, message: str, retry_after_s: float | None = None):
        super().__init__(message)
        assert kind in STATUS, kind
        self.kind = kind
        self.message = message
        self.retry_after_s = retry_after_s

    @property
    def status(self) -> int:
        return STATUS[self.kind]


def error_response(kind: str, message: str, retry_after_s: float | None = None,
                   headers: dict[str, str] | None = None) -> Response:
    headers = dict(headers or {})
    if retry_after_s is not None:
        headers["Retry-After"] = str(max(1, round(retry_after_s)))
    if kind == "unauthorized":
        headers["WWW-Authenticate"] = "Bearer"
    return json_response({"error": message, "error_type": kind}, status_code=STATUS[kind], headers=headers or None)


def _describe_validation(exc: RequestValidationError) -> str:
    problems = []
    for error in exc.errors()[:5]:
        if error.get("type") == "json_invalid":
            return "the request body is not valid JSON"
        location = ".".join(str(part) for part in error.get("loc", ()) if part != "body") or "body"
        problems.append(f"{location}: {error.get('msg', 'invalid')}")
    more = len(exc.errors()) - 5
    return "; ".join(problems) + (f" (and {more} more)" if more > 0 else "")


def install_error_handlers(app: FastAPI, on_error=None) -> None:
    """`on_error(kind, request)` is called for every error response (metrics)."""

    def respond(request: Request, kind: str, message: str, retry_after_s: float | None = None,
                headers: dict[str, str] | None = None) -> Response:
        if on_error is not None:
            on_error(kind, request)
        return error_response(kind, message, retry_after_s, headers)

    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, exc: ServiceError):
        return respond(request, exc.kind, exc.message, exc.retry_after_s)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        return respond(request, "validation", _describe_validation(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        kind = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large", 401: "unauthorized"}.get(
            exc.status_code, "validation")
        message = {404: f"no route {request.url.path}", 405: f"{request.method} is not allowed on {request.url.path}"}
        # Starlette's own headers (the `Allow` list of a 405, RFC 9110) go out with our body.
        return respond(request, kind, message.get(exc.status_code, str(exc.detail)), headers=exc.headers)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):
        log.exception("internal error on %s", request.url.path)
        return respond(request, "internal", "internal error; the server log has the details")
